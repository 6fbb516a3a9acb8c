/**
 * Host-side secret sources (`env`, `env:<NAME>`, `file:<path>`, `command:<cmd>`) are the
 * operator's, not the tenant's: a spec may use one only when the operator allows it
 * (SVC_SECRET_ENV_ALLOW, SVC_SECRET_FILE_DIRS, SVC_SECRET_COMMANDS); with auth off (trusted local
 * use) they are all allowed unless a list says otherwise. `dashboard` is always allowed.
 */
import { execFile } from 'node:child_process';
import { readFile, realpath } from 'node:fs/promises';
import path from 'node:path';
import type { Config } from './config.ts';

type SecretPolicy = Pick<Config, 'authRequired' | 'secretEnvAllow' | 'secretFileDirs' | 'secretCommands'>;

/** Why a source is refused, or null when it is allowed. */
export function refusedSource(name: string, source: string, config: SecretPolicy): string | null {
  const open = !config.authRequired;
  if (source === 'dashboard') return null;
  if (source === 'env' || source.startsWith('env:')) {
    const variable = source === 'env' ? name : source.slice(4);
    const allow = config.secretEnvAllow;
    if (allow === null ? open : allow.includes('*') || allow.includes(variable)) return null;
    return `source "${source}" reads the server's environment variable ${variable}, which the operator has not allowed (SVC_SECRET_ENV_ALLOW)`;
  }
  if (source.startsWith('file:')) {
    const file = path.resolve(source.slice(5));
    const dirs = config.secretFileDirs;
    if (dirs === null ? open : dirs.some((d) => file.startsWith(path.resolve(d) + path.sep))) return null;
    return `source "${source}" reads a file of the server that the operator has not allowed (SVC_SECRET_FILE_DIRS)`;
  }
  if (source.startsWith('command:')) {
    const command = source.slice(8);
    const commands = config.secretCommands;
    if (commands === null ? open : commands.includes(command)) return null;
    return `source "${source}" runs a command on the server that the operator has not allowed (SVC_SECRET_COMMANDS)`;
  }
  return `unknown source "${source}"`;
}

/** Resolves an allowed host-side source; throws an Error saying why it cannot be resolved. */
export async function resolveHostSecret(name: string, source: string, config: SecretPolicy): Promise<string> {
  const refused = refusedSource(name, source, config);
  if (refused) throw new Error(refused);
  if (source === 'env' || source.startsWith('env:')) {
    const variable = source === 'env' ? name : source.slice(4);
    const value = process.env[variable];
    if (value === undefined) throw new Error(`environment variable ${variable} is not set on the server`);
    return value;
  }
  if (source.startsWith('file:')) {
    const file = source.slice(5);
    try {
      // The real path must still be inside an allowed directory (no symlink escape).
      const real = await realpath(file);
      if (refusedSource(name, `file:${real}`, config)) throw new Error(`file ${file} resolves outside the allowed directories`);
      return (await readFile(real, 'utf8')).replace(/\r?\n$/, '');
    } catch (err) {
      throw new Error(`file ${file} cannot be read: ${(err as Error).message}`);
    }
  }
  const command = source.slice(8);
  return new Promise((resolve, reject) => {
    execFile('/bin/sh', ['-c', command], { timeout: 10_000, maxBuffer: 1024 * 1024 }, (err, stdout) => {
      if (err) reject(new Error(`command exited with ${(err as { code?: unknown }).code ?? err.message}`));
      else resolve(stdout.replace(/\r?\n$/, ''));
    });
  });
}
