/**
 * Which process tracer a runner uses, and the build of the purpose-built one: the BPF program and
 * its loader (process-tracer/: tracer.bpf.c for the kernel, tracer.c its loader), compiled on
 * first use with clang and gcc (libbpf) and cached by the sources' hash, like the sandbox
 * supervisor. Where they cannot be built, bpftrace (with bpftool and tracefs) runs the same
 * capture. process-tracer.ts is the tracer itself.
 */
import { execFile, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { hostTool } from './host-tools.ts';

const TRACEFS = '/sys/kernel/tracing';

/** The default of SVC_PROCESS_TRACER: the built tracer, else the bpftrace on PATH. */
const BUILTIN = 'builtin';
const SOURCES = path.resolve(path.dirname(fileURLToPath(import.meta.url)), './process-tracer');
const SOURCE_FILES = ['tracer.bpf.c', 'tracer.c', 'tracer.h'];
const BTF = '/sys/kernel/btf/vmlinux';

export const BPFTOOL = hostTool('bpftool');
const run = promisify(execFile);

/** `builtin`: the built tracer where it can be built, else the bpftrace on PATH; a path: that bpftrace. */
export function chooseTracer(setting: string): { built: boolean; binary: string } | string {
  const unbuildable = setting === BUILTIN ? builtUnavailable() : null;
  if (setting === BUILTIN && unbuildable === null) return { built: true, binary: BUILTIN };
  const binary = setting === BUILTIN ? 'bpftrace' : setting;
  const why = tracerUnavailable(binary);
  if (why === null) return { built: false, binary };
  return unbuildable ? `the process tracer cannot be built (${unbuildable}) and ${why}` : why;
}

/** Why the built tracer cannot be built or run here, or null. */
function builtUnavailable(): string | null {
  for (const tool of ['clang', 'gcc']) if (!hostTool(tool)) return `no ${tool}: apt-get install ${tool}`;
  if (!fs.existsSync('/usr/include/bpf/libbpf.h')) return 'no libbpf headers: apt-get install libbpf-dev';
  if (!fs.existsSync(BTF)) return `the kernel has no BTF (${BTF})`;
  return null;
}

/** Why bpftrace cannot run here, or null when it can (mounting tracefs if it is not). */
function tracerUnavailable(binary: string): string | null {
  if (spawnSync(binary, ['--version'], { stdio: 'ignore' }).status !== 0) return `${binary} does not run (apt-get install bpftrace, or set SVC_PROCESS_TRACER)`;
  if (!BPFTOOL || spawnSync(BPFTOOL, ['version'], { stdio: 'ignore' }).status !== 0) return 'bpftool does not run (apt-get install bpftool)';
  if (!fs.existsSync(`${TRACEFS}/events/sched`)) {
    const mounted = spawnSync('mount', ['-t', 'tracefs', 'nodev', TRACEFS], { stdio: 'ignore' });
    if (mounted.status !== 0 || !fs.existsSync(`${TRACEFS}/events/sched`)) return `tracefs is not mounted at ${TRACEFS} and could not be`;
  }
  return null;
}

let building: Promise<{ loader: string; object: string }> | null = null;

/**
 * The built tracer: its loader and BPF object, compiled from services/sandbox-runner/runtimes/local/process-tracer/ on first use
 * and cached (in ~/.cache/svc-process-tracer) by the sources' hash.
 */
export function builtTracer(): Promise<{ loader: string; object: string }> {
  building ??= buildTracer().catch((err: unknown) => {
    building = null;
    throw err;
  });
  return building;
}

async function buildTracer(): Promise<{ loader: string; object: string }> {
  const hash = createHash('sha256');
  for (const file of SOURCE_FILES) hash.update(file).update(await fs.promises.readFile(path.join(SOURCES, file)));
  const dir = path.join(process.env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache'), 'svc-process-tracer', hash.digest('hex').slice(0, 16));
  const built = { loader: path.join(dir, 'tracer'), object: path.join(dir, 'tracer.bpf.o') };
  if (fs.existsSync(built.loader) && fs.existsSync(built.object)) return built;
  await fs.promises.mkdir(dir, { recursive: true, mode: 0o700 });
  const tmp = `.${process.pid}.tmp`;
  const compile = async (tool: string, args: string[]) => {
    try {
      await run(tool, args, { cwd: SOURCES });
    } catch (err) {
      const { stderr, message } = err as { stderr?: string; message: string };
      throw new Error(`cannot build the process tracer (apt-get install clang gcc libbpf-dev): ${(stderr || message).trim().slice(-1000)}`);
    }
  };
  // linux/types.h includes asm/types.h, which is in the multiarch include directory clang -target bpf does not search.
  const multiarch = spawnSync('gcc', ['-print-multiarch'], { encoding: 'utf8' }).stdout?.trim();
  await compile('clang', [
    '-O2',
    '-g',
    '-target',
    'bpf',
    ...(multiarch ? [`-I/usr/include/${multiarch}`] : []),
    '-c',
    'tracer.bpf.c',
    '-o',
    built.object + tmp,
  ]);
  await compile('gcc', ['-O2', '-o', built.loader + tmp, 'tracer.c', '-lbpf']);
  await fs.promises.rename(built.object + tmp, built.object);
  await fs.promises.rename(built.loader + tmp, built.loader);
  return built;
}
