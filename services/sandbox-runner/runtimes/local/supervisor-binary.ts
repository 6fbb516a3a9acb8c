/**
 * The supervisor's binary (supervisor/supervisor.c): compiled statically with gcc on the host,
 * cached in the runtime's state directory by the source's hash, and bound read-only into every
 * sandbox at SUPERVISOR_IN_SANDBOX.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Logger } from '../../../kernel/logger.ts';

const HERE = path.dirname(fileURLToPath(import.meta.url));
/** The supervisor's C source of this repository. */
export const DEFAULT_SUPERVISOR_SOURCE = path.resolve(HERE, './supervisor/supervisor.c');
/** Where a sandbox sees the supervisor (its `serve` is found by this path in /proc, LocalSandbox.processes). */
export const SUPERVISOR_IN_SANDBOX = '/run/svc/supervisor';

/** `source` compiled into `<stateDir>/bin/supervisor-<hash>`, unless it is there already. */
export async function buildSupervisor(source: string, stateDir: string, logger: Logger | undefined): Promise<string> {
  const text = await fs.promises.readFile(source);
  const hash = createHash('sha256').update(text).digest('hex').slice(0, 16);
  const binDir = path.join(stateDir, 'bin');
  const binary = path.join(binDir, `supervisor-${hash}`);
  if (fs.existsSync(binary)) return binary;
  await fs.promises.mkdir(binDir, { recursive: true });
  const tmp = `${binary}.${process.pid}.tmp`;
  const result = await run('gcc', ['-O2', '-static', '-o', tmp, source]);
  if (result.code !== 0) throw new Error(`cannot build the sandbox supervisor (apt-get install gcc libc6-dev): ${result.stderr.trim() || result.error}`);
  await fs.promises.chmod(tmp, 0o755);
  await fs.promises.rename(tmp, binary);
  logger?.info({ binary }, 'built the sandbox supervisor');
  return binary;
}

function run(command: string, args: string[]): Promise<{ code: number; stderr: string; error?: string }> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
    child.on('error', (err) => resolve({ code: -1, stderr, error: err.message }));
    child.on('close', (code) => resolve({ code: code ?? -1, stderr }));
  });
}
