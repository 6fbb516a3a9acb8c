/**
 * An agent bundle (or a task-file bundle) made from a directory: a .tar.gz of its files, minus
 * what `.svcignore` (gitignore syntax, read by the `ignore` package) and the defaults leave out.
 * The archive is reproducible: entries sorted, owners and times zeroed, so the same files give
 * the same digest, and `svc eval` can tell whether an agent changed since its last upload.
 *
 * An optional manifest `svc-agent.json` in the directory gives the upload's metadata
 * (`{name?, entrypoint, runtime?, tag?, auth?}`), so `svc agents push DIR` needs no flags.
 */
import { createHash } from 'node:crypto';
import { lstatSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import ignore from 'ignore';
import { create } from 'tar';
import { CliError } from './errors.ts';

export const IGNORE_FILE = '.svcignore';
export const MANIFEST_FILE = 'svc-agent.json';
/** Left out whatever .svcignore says: version control and the CLI's own files. */
const ALWAYS_IGNORED = ['.git/', '.hg/', '.svn/', IGNORE_FILE];

export interface Bundle {
  bytes: Buffer;
  digest: string;
  files: string[];
}

export interface AgentManifest {
  name?: string;
  entrypoint?: string[] | string;
  runtime?: string;
  tag?: string;
  auth?: unknown;
}

function directory(dir: string): string {
  const stat = lstatSync(dir, { throwIfNoEntry: false });
  if (!stat?.isDirectory()) throw new CliError(`${dir}: not a directory`);
  return path.resolve(dir);
}

/** The files of `dir` the bundle holds, relative with `/`, sorted. */
export function bundleFiles(dir: string): string[] {
  const root = directory(dir);
  const rules = ignore().add(ALWAYS_IGNORED);
  const ignoreFile = path.join(root, IGNORE_FILE);
  if (lstatSync(ignoreFile, { throwIfNoEntry: false })?.isFile()) rules.add(readFileSync(ignoreFile, 'utf8'));
  const found: string[] = [];
  const walk = (rel: string) => {
    for (const entry of readdirSync(path.join(root, rel), { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const name = rel === '' ? entry.name : `${rel}/${entry.name}`;
      if (entry.isDirectory()) {
        if (!rules.ignores(`${name}/`)) walk(name);
      } else if ((entry.isFile() || entry.isSymbolicLink()) && !rules.ignores(name)) {
        found.push(name);
      }
    }
  };
  walk('');
  return found;
}

/** The .tar.gz of `dir`'s files: reproducible, so equal files give an equal digest. */
export async function buildBundle(dir: string): Promise<Bundle> {
  const root = directory(dir);
  const files = bundleFiles(root);
  if (files.length === 0) throw new CliError(`${dir}: no files to bundle (everything is ignored by ${IGNORE_FILE}?)`);
  const chunks: Buffer[] = [];
  const stream = create({ gzip: true, cwd: root, portable: true, mtime: new Date(0), noDirRecurse: true, follow: false }, files);
  for await (const chunk of stream as AsyncIterable<Buffer>) chunks.push(Buffer.from(chunk));
  const bytes = Buffer.concat(chunks);
  return { bytes, digest: `sha256:${createHash('sha256').update(bytes).digest('hex')}`, files };
}

/** `svc-agent.json` of `dir`, or {} when it has none. */
export function readManifest(dir: string): AgentManifest {
  const file = path.join(directory(dir), MANIFEST_FILE);
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return {};
  }
  try {
    const parsed = JSON.parse(text) as AgentManifest;
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error('not an object');
    return parsed;
  } catch (err) {
    throw new CliError(`${file}: not a JSON object (${(err as Error).message})`);
  }
}

/** An entrypoint given as a command line (`python main.py`) or a JSON list, in exec form. */
export function entrypointOf(value: string | string[] | undefined): string[] | undefined {
  if (value === undefined) return undefined;
  if (Array.isArray(value)) return value;
  const trimmed = value.trim();
  if (trimmed.startsWith('[')) {
    try {
      const list = JSON.parse(trimmed) as unknown;
      if (Array.isArray(list) && list.every((v) => typeof v === 'string')) return list as string[];
    } catch {
      // a command line after all
    }
  }
  return trimmed.split(/\s+/).filter(Boolean);
}
