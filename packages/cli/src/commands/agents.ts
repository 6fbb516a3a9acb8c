/**
 * `svc agents push|list|versions|show|rm`: agent snapshots. push bundles a directory
 * (bundle.ts: `.svcignore`, `svc-agent.json`) and uploads it as the next version of its name.
 */
import type { Command } from 'commander';
import type { AgentSnapshot, SvcClient } from '../../../sdk/src/client.ts';
import { buildBundle, entrypointOf, readManifest } from '../bundle.ts';
import { CliError } from '../errors.ts';
import type { CliContext } from '../main.ts';
import { printJson, table } from '../output.ts';

export interface PushedAgent {
  snapshot: AgentSnapshot;
  uploaded: boolean;
  files: number;
}

/**
 * Uploads `dir` as agent `name`, unless its latest version has the same digest already (and the
 * same tag, when one is asked): then that version is the answer and nothing is uploaded.
 */
export async function pushAgent(
  client: SvcClient,
  dir: string,
  opts: { name?: string; tag?: string; entrypoint?: string; runtime?: string; force?: boolean; fallbackName?: string },
): Promise<PushedAgent> {
  const manifest = readManifest(dir);
  const name = opts.name ?? manifest.name ?? opts.fallbackName;
  if (!name) throw new CliError('--name: give the agent\'s name (or "name" in svc-agent.json)');
  const entrypoint = entrypointOf(opts.entrypoint ?? manifest.entrypoint);
  if (!entrypoint || entrypoint.length === 0)
    throw new CliError(
      `--entrypoint: give the command that runs the agent from /agent, e.g. --entrypoint "python main.py" (or "entrypoint" in ${dir}/svc-agent.json)`,
    );
  const bundle = await buildBundle(dir);
  const tag = opts.tag ?? manifest.tag;
  if (!opts.force) {
    try {
      const latest = await client.agents.latest(name);
      if (latest.digest === bundle.digest && (tag === undefined || latest.tag === tag) && JSON.stringify(latest.entrypoint) === JSON.stringify(entrypoint)) {
        return { snapshot: latest, uploaded: false, files: bundle.files.length };
      }
    } catch (err) {
      if ((err as { status?: number }).status !== 404) throw err;
    }
  }
  const metadata = {
    name,
    entrypoint,
    ...(manifest.runtime || opts.runtime ? { runtime: opts.runtime ?? manifest.runtime } : {}),
    ...(tag ? { tag } : {}),
    ...(manifest.auth !== undefined ? { auth: manifest.auth } : {}),
  };
  const snapshot = await client.agents.upload(bundle.bytes, metadata);
  return { snapshot, uploaded: true, files: bundle.files.length };
}

/** `snap_…`, `NAME@VERSION`, `NAME:TAG` or `NAME` (its latest version). */
export async function resolveAgent(client: SvcClient, ref: string): Promise<AgentSnapshot> {
  if (ref.startsWith('snap_')) return client.agents.snapshot(ref);
  const at = /^(.+)@(\d+)$/.exec(ref);
  if (at) return client.agents.version(at[1], Number(at[2]));
  const tagged = /^(.+):([^:]+)$/.exec(ref);
  if (tagged) return client.agents.byTag(tagged[1], tagged[2]);
  return client.agents.latest(ref);
}

const row = (s: AgentSnapshot) => [s.name, s.version, String(s.tag ?? ''), s.id, s.digest.slice(0, 19), String(s.size_bytes ?? ''), String(s.created_at ?? '')];
const HEAD = ['name', 'version', 'tag', 'id', 'digest', 'bytes', 'created'];

export function agentsCommands(program: Command, context: CliContext): void {
  const agents = program.command('agents').description('agent snapshots: push a directory, list, read, delete');

  agents
    .command('push')
    .description('bundle DIR (honouring .svcignore) and upload it as the next version of the agent')
    .argument('<dir>')
    .option('--name <name>', 'agent name (default: "name" in svc-agent.json)')
    .option('--tag <tag>', 'a label for this version')
    .option('--entrypoint <command>', 'what runs the agent, from /agent: "python main.py" or a JSON list (default: svc-agent.json)')
    .option('--runtime <hint>', 'a runtime hint, e.g. python3.12')
    .option('--force', 'upload even when the latest version has the same digest')
    .option('--json', 'print the snapshot as JSON')
    .action(async (dir: string, opts: { name?: string; tag?: string; entrypoint?: string; runtime?: string; force?: boolean; json?: boolean }) => {
      const pushed = await pushAgent(context.client(), dir, opts);
      if (opts.json) return printJson({ ...pushed.snapshot, uploaded: pushed.uploaded });
      const s = pushed.snapshot;
      const what = pushed.uploaded ? 'pushed agent' : 'unchanged (same digest): agent';
      process.stdout.write(
        `${what} ${s.name} version ${s.version}${s.tag ? ` (tag ${s.tag})` : ''}: ${s.id}\ndigest ${s.digest}, ${s.size_bytes} bytes, ${pushed.files} files\n`,
      );
    });

  agents
    .command('list')
    .description('the newest version of each agent')
    .option('--json', 'as JSON')
    .action(async (opts: { json?: boolean }) => {
      const page = await context.client().agents.list({ limit: 1000 });
      if (opts.json) return printJson(page.items);
      process.stdout.write(`${table(HEAD, page.items.map(row))}\n`);
    });

  agents
    .command('versions')
    .description('the live versions of one agent')
    .argument('<name>')
    .option('--json', 'as JSON')
    .action(async (name: string, opts: { json?: boolean }) => {
      const page = await context.client().agents.versions(name, { limit: 1000 });
      if (opts.json) return printJson(page.items);
      process.stdout.write(`${table(HEAD, page.items.map(row))}\n`);
    });

  agents
    .command('show')
    .description('one snapshot: snap_…, NAME@VERSION, NAME:TAG or NAME (latest)')
    .argument('<ref>')
    .action(async (ref: string) => printJson(await resolveAgent(context.client(), ref)));

  agents
    .command('rm')
    .description('delete a snapshot (frees its storage; cannot be undone)')
    .argument('<snapshot-id>')
    .action(async (id: string) => {
      await context.client().agents.deleteSnapshot(id);
      process.stdout.write(`deleted snapshot ${id}\n`);
    });
}
