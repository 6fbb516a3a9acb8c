/**
 * Warm sandboxes: a create whose sandbox has the same shape as recent ones (its class: image,
 * resources, user and root, read-only mounts, static hosts, the bridge to the service) takes one
 * made ahead instead of waiting for the runtime, with its id (its cgroups renamed) and environment
 * made the create's (`SandboxHandle.adopt`); its workspace stays where it was made, in the runner's workspaces
 * directory under a `pool-` name. A pooled sandbox has never run anything: it is made, waits, and is
 * handed out once (or destroyed); nothing of one sandbox ever reaches another.
 *
 * Classes are learned from demand. A class gets warm sandboxes from its second create on (a shape
 * seen once, say a one-off agent bundle, costs nothing extra), up to `size` of them, refilled in
 * the background after each take; at most `classes` classes are kept (the least recently used
 * goes first), and a class unused for `idleMs` is emptied. Sandboxes with a network are not
 * pooled: their network slots are made ahead already (local-network.ts), and the gateway's
 * registration is per sandbox anyway.
 */
import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import path from 'node:path';
import type { Logger } from '../../kernel/logger.ts';
import { removeBeneath } from '../workspace/beneath.ts';
import type { CreateSandboxOptions, Runtime, SandboxHandle } from './runtime.ts';

export interface SandboxPoolOptions {
  /** warm sandboxes kept per class (0: no pool) */
  size: number;
  /** classes kept at once */
  classes: number;
  /** a class unused this long is emptied */
  idleMs: number;
  /** where the warm sandboxes' workspaces are made (the runner's workspaces directory: a taken one stays there) */
  dir: string;
  /** this runner's part of their names (`pool-<owner>-...`): runners sharing the directory leave each other's alone */
  owner: string;
  logger?: Logger;
}

interface PoolClass {
  key: string;
  /** the options of its sandboxes, but for their id, workspace and env */
  template: CreateSandboxOptions;
  creates: number;
  lastUsed: number;
  idle: Warm[];
  filling: Promise<void> | null;
}

const POOL_PREFIX = 'pool-';

/** A warm sandbox and its workspace on the host. */
export interface Warm {
  box: SandboxHandle;
  workspace: string;
}

export class SandboxPool {
  private readonly classes = new Map<string, PoolClass>();
  private closed = false;
  private readonly sweep: NodeJS.Timeout | null;

  constructor(
    private readonly runtime: Runtime,
    private readonly options: SandboxPoolOptions,
  ) {
    // What a previous process left untaken (its sandboxes died with it; their workspaces did not).
    mkdirSync(options.dir, { recursive: true });
    const mine = `${POOL_PREFIX}${options.owner}-`;
    for (const name of readdirSync(options.dir).filter((n) => n.startsWith(mine))) removeBeneath(path.join(options.dir, name));
    this.sweep = options.size > 0 ? setInterval(() => void this.expire(), Math.min(options.idleMs, 60_000)) : null;
    this.sweep?.unref();
  }

  /** Warm sandboxes waiting, per class. */
  get idleCount(): number {
    return [...this.classes.values()].reduce((n, c) => n + c.idle.length, 0);
  }

  /**
   * A warm sandbox of `options`' class with `options.env`, and its workspace on the host; null
   * when none is waiting (the caller creates one). Either way the class is refilled meanwhile.
   */
  async take(options: CreateSandboxOptions): Promise<Warm | null> {
    if (this.options.size <= 0 || this.closed || options.network) return null;
    const key = classKey(options);
    let cls = this.classes.get(key);
    if (!cls) {
      cls = { key, template: options, creates: 0, lastUsed: 0, idle: [], filling: null };
      this.classes.set(key, cls);
      this.evict();
    }
    cls.creates++;
    cls.lastUsed = Date.now();
    // Most recently used last: the first entry is the one to evict.
    this.classes.delete(key);
    this.classes.set(key, cls);
    const warm = cls.idle.shift() ?? null;
    if (cls.creates >= 2) this.fill(cls);
    if (!warm) return null;
    try {
      if (!warm.box.adopt) throw new Error(`the ${warm.box.runtime} runtime cannot hand out a warm sandbox`);
      await warm.box.adopt({ id: options.id, env: options.env });
      return warm;
    } catch (err) {
      this.options.logger?.warn({ err }, 'a warm sandbox could not be handed out; creating one');
      await this.discard(warm);
      return null;
    }
  }

  /** Destroys every warm sandbox; no more are made. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.sweep) clearInterval(this.sweep);
    const classes = [...this.classes.values()];
    this.classes.clear();
    await Promise.all(classes.map((c) => c.filling));
    await Promise.all(classes.flatMap((c) => c.idle.splice(0).map((warm) => this.discard(warm))));
  }

  /** Makes warm sandboxes of `cls`, one at a time, until it has `size` (in the background). */
  private fill(cls: PoolClass): void {
    cls.filling ??= (async () => {
      try {
        while (!this.closed && this.classes.get(cls.key) === cls && cls.idle.length < this.options.size) {
          const warm = await this.make(cls.template);
          if (this.closed || this.classes.get(cls.key) !== cls) {
            await this.discard(warm);
            return;
          }
          cls.idle.push(warm);
          // One that dies while it waits (it should not) is not handed out.
          void warm.box.exited.then(() => {
            const at = cls.idle.indexOf(warm);
            if (at >= 0) void this.discard(cls.idle.splice(at, 1)[0]);
          });
        }
      } catch (err) {
        this.options.logger?.warn({ err }, 'a warm sandbox could not be made');
      } finally {
        cls.filling = null;
      }
    })();
  }

  private async make(template: CreateSandboxOptions): Promise<Warm> {
    const id = `${POOL_PREFIX}${this.options.owner}-${randomBytes(8).toString('hex')}`;
    const workspace = path.join(this.options.dir, id);
    // Read-only mounts from inside the workspace (its `.svc`) come from the warm one's own.
    const readOnlyMounts = (template.readOnlyMounts ?? []).map((m) => {
      const inside = path.relative(template.workspace, m.host);
      return inside.startsWith('..') || path.isAbsolute(inside) ? m : { host: path.join(workspace, inside), sandbox: m.sandbox };
    });
    for (const m of readOnlyMounts) if (m.host.startsWith(`${workspace}${path.sep}`)) await mkdir(m.host, { recursive: true });
    try {
      return { box: await this.runtime.create({ ...template, id, workspace, env: {}, readOnlyMounts }), workspace };
    } catch (err) {
      removeBeneath(workspace);
      throw err;
    }
  }

  /** Destroys a warm sandbox that was not handed out, and its workspace; never rejects (callers fire and forget it). */
  private async discard(warm: Warm | undefined): Promise<void> {
    if (!warm) return;
    await warm.box.destroy().catch((err: Error) => this.options.logger?.warn({ err }, 'a warm sandbox could not be destroyed'));
    try {
      removeBeneath(warm.workspace);
    } catch (err) {
      this.options.logger?.warn({ err }, 'the workspace of a warm sandbox could not be removed');
    }
  }

  /**
   * Keeps at most `classes` classes: the least recently used go, their warm sandboxes destroyed
   * in the background (not on the path of the create that made a new class).
   */
  private evict(): void {
    while (this.classes.size > this.options.classes) {
      const [key, oldest] = this.classes.entries().next().value as [string, PoolClass];
      this.classes.delete(key);
      for (const warm of oldest.idle.splice(0)) void this.discard(warm);
    }
  }

  /** Empties the classes unused for `idleMs`. */
  private async expire(): Promise<void> {
    const now = Date.now();
    for (const [key, cls] of [...this.classes]) {
      if (now - cls.lastUsed < this.options.idleMs) continue;
      this.classes.delete(key);
      await Promise.all(cls.idle.splice(0).map((warm) => this.discard(warm)));
    }
  }
}

/** What makes two creates' sandboxes interchangeable: every option but the id, the workspace and the environment. */
function classKey(options: CreateSandboxOptions): string {
  const mounts = (options.readOnlyMounts ?? []).map((m) => {
    const inside = path.relative(options.workspace, m.host);
    return [inside.startsWith('..') || path.isAbsolute(inside) ? m.host : `<workspace>/${inside}`, m.sandbox];
  });
  return JSON.stringify([
    options.rootfs,
    options.resources,
    options.user ?? 'nobody',
    options.writableRoot ?? null,
    options.hosts ?? {},
    options.service ?? null,
    options.hostname ?? null,
    mounts,
  ]);
}
