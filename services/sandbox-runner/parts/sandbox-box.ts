/**
 * A sandbox's runtime handle (runtimes/runtime.ts `SandboxHandle`, "the box") and its workspace
 * on the host: made or taken warm from the pool by boot/runtime.ts, destroyed and removed
 * at teardown (two steps of the teardown stack: the sandbox, then its workspace).
 */
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { CreateSandboxOptions, Runtime, SandboxHandle } from '../runtimes/runtime.ts';
import type { SandboxPool } from '../runtimes/sandbox-pool.ts';
import { removeBeneath } from '../workspace/beneath.ts';

/** The image the sandbox runs: its reference, digest, and what replaced it when it could not be had. */
export type RunningImage = { reference: string; digest: string | null; replaced: string | null };

export class SandboxBox {
  private box: SandboxHandle | null = null;
  /** on the host: `workspaces/<id>`, or where a warm sandbox taken from the pool was made */
  workspace: string;
  /** The image the sandbox runs, once the runtime started. */
  image: RunningImage | null = null;

  constructor(
    private readonly runtime: Runtime,
    /** warm sandboxes made ahead (null: none) */
    private readonly pool: SandboxPool | null,
    workspace: string,
  ) {
    this.workspace = workspace;
  }

  /** The runtime's handle; only once the runtime started (boot step container_started). */
  get handle(): SandboxHandle {
    return this.box!;
  }

  /** Takes a warm sandbox made alike from the pool, else creates one; true when it was warm. */
  async start(options: CreateSandboxOptions): Promise<boolean> {
    const warm = await this.pool?.take(options);
    if (warm) this.workspace = warm.workspace;
    else await mkdir(path.join(this.workspace, '.svc'), { recursive: true });
    this.box = warm?.box ?? (await this.runtime.create(options));
    return Boolean(warm);
  }

  /** The sandbox's /tmp on the host (a place the runtime shows the service). */
  tmpOnHost(): string {
    const tmp = this.box!.writablePlaces.find((place) => place.at === '/tmp');
    if (!tmp) throw new Error(`the ${this.runtime.name} runtime does not show the sandbox's /tmp to the service`);
    return tmp.host;
  }

  /** Ends every process of the sandbox (a teardown step; nothing to do before it started). */
  async destroy(): Promise<void> {
    await this.box?.destroy();
  }

  /** Removes the workspace (a teardown step, after the sandbox is destroyed). */
  removeWorkspace(): void {
    // Never by path: should a process of the sandbox have survived, it may be swapping links.
    const left = removeBeneath(this.workspace);
    if (left > 0) throw new Error(`${left} entries could not be removed`);
  }
}
