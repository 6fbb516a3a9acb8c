/**
 * The runtime contract suite (test/runtime/conformance.ts) on the `local` runtime: bubblewrap
 * sandboxes in cgroups of their own, a workspace on a loop-mounted disk of its own, a network
 * namespace `svc-<id>` for a sandbox with a network. Its root is the host's system directories
 * (SVC_SANDBOX_HOST_ROOTFS: no image store needed here; the host is Debian bookworm, as the
 * suite's spec asks).
 *
 * What it would leave of a sandbox on the host, for the suite's "nothing left" checks: processes
 * in its cgroups, the cgroups themselves (named after the sandbox in each hierarchy), mounts of
 * its workspace (or naming it), its network namespace, its workspace directory.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, type Dirent } from 'node:fs';
import path from 'node:path';
import { backend } from '../helpers/backend.ts';
import { sandboxPids } from '../helpers/sandboxes.ts';
import { runtimeConformance, type Leftovers, type SandboxOnHost } from './conformance.ts';

const bwrap = backend('SVC_TEST_BWRAP', 'runtime conformance: the local runtime');

const CGROUP_ROOT = '/sys/fs/cgroup';

/** Directories under the cgroup hierarchies (three levels deep: <hierarchy>/svc/<id>) named after `id`. */
function cgroupsNamed(id: string): string[] {
  const found: string[] = [];
  const walk = (dir: string, depth: number) => {
    let entries: Dirent[];
    try {
      entries = readdirSync(dir, { withFileTypes: true });
    } catch {
      return; // gone meanwhile
    }
    for (const entry of entries) {
      if (!entry.isDirectory()) continue;
      const at = path.join(dir, entry.name);
      if (entry.name.includes(id)) found.push(at);
      else if (depth < 3) walk(at, depth + 1);
    }
  };
  walk(CGROUP_ROOT, 1);
  return found;
}

const commandLine = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim();
  } catch {
    return '(gone meanwhile)';
  }
};

async function leftovers({ id, path: workspace }: SandboxOnHost): Promise<Leftovers> {
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter((l) => l.includes(id) || l.split(' ')[4] === workspace);
  const namespaces = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' })
    .split('\n')
    .map((l) => l.split(' ')[0]!)
    .filter((n) => n === `svc-${id}`);
  return {
    processes: sandboxPids(id).map((pid) => `process ${pid}: ${commandLine(pid)}`),
    resources: [
      ...cgroupsNamed(id).map((dir) => `cgroup ${dir}`),
      ...mounts.map((line) => `mount ${line.split(' ').slice(3, 5).join(' ')}`),
      ...namespaces.map((name) => `netns ${name}`),
      ...(existsSync(workspace) ? [`workspace ${workspace}`] : []),
    ],
  };
}

runtimeConformance({
  name: 'local',
  unavailable: bwrap === null ? 'SVC_TEST_BWRAP is unset' : null,
  env: { SVC_RUNTIME: 'local', SVC_SANDBOX_HOST_ROOTFS: 'true' },
  leftovers,
});
