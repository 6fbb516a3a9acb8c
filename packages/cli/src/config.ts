/**
 * Where the CLI finds the service and the key: flags first, then SVC_BASE_URL / SVC_API_KEY, then
 * the per-user file `svc login` writes ($XDG_CONFIG_HOME/svc/config.json, else
 * ~/.config/svc/config.json; SVC_CONFIG names another). The file is mode 0600 in a 0700
 * directory: it holds a secret.
 */
import { chmodSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { CliError } from './errors.ts';

export interface StoredConfig {
  base_url?: string;
  api_key?: string;
}

export interface Connection {
  baseUrl: string;
  apiKey: string | undefined;
  /** Where each value came from, for `svc login --show`. */
  from: { baseUrl: string; apiKey: string };
}

export function configPath(env: NodeJS.ProcessEnv = process.env): string {
  if (env.SVC_CONFIG) return path.resolve(env.SVC_CONFIG);
  const base = env.XDG_CONFIG_HOME || path.join(os.homedir(), '.config');
  return path.join(base, 'svc', 'config.json');
}

export function readConfig(file = configPath()): StoredConfig {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return {};
    throw new CliError(`cannot read ${file}: ${(err as Error).message}`);
  }
  try {
    const parsed = JSON.parse(text) as StoredConfig;
    return typeof parsed === 'object' && parsed !== null ? parsed : {};
  } catch {
    throw new CliError(`${file} is not JSON: fix or remove it, then run \`svc login\` again`);
  }
}

/** Writes the file atomically with mode 0600 (its directory 0700). */
export function writeConfig(config: StoredConfig, file = configPath()): void {
  mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(config, null, 2)}\n`, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, file);
}

export function normaliseUrl(url: string): string {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new CliError(`--url: "${url}" is not a URL (e.g. http://127.0.0.1:8080)`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new CliError(`--url: "${url}" must be http:// or https://`);
  return parsed.toString().replace(/\/+$/, '');
}

/** The service address and key for this run. */
export function connection(flags: { url?: string; key?: string } = {}, env: NodeJS.ProcessEnv = process.env): Connection {
  const stored = readConfig(configPath(env));
  const file = configPath(env);
  const [baseUrl, urlFrom] = flags.url
    ? [flags.url, '--url']
    : env.SVC_BASE_URL
      ? [env.SVC_BASE_URL, 'SVC_BASE_URL']
      : stored.base_url
        ? [stored.base_url, file]
        : [`http://127.0.0.1:${env.SVC_PORT || 8080}`, 'the default'];
  const [apiKey, keyFrom] = flags.key
    ? [flags.key, '--key']
    : env.SVC_API_KEY
      ? [env.SVC_API_KEY, 'SVC_API_KEY']
      : stored.api_key
        ? [stored.api_key, file]
        : [undefined, 'nowhere'];
  return { baseUrl: normaliseUrl(baseUrl), apiKey, from: { baseUrl: urlFrom, apiKey: keyFrom } };
}
