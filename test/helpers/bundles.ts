/**
 * Agent bundles for tests: real .tar.gz archives made with node-tar (hostile ones too), and the
 * multipart upload of POST /v1/agents.
 */
import { createHash } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { create } from 'tar';
import type { TestServer } from './server.ts';

/** A gzip'd tar of `files` (path -> content) plus `links` (path -> symlink target). */
export async function makeBundle(files: Record<string, string | Buffer>, options: { links?: Record<string, string> } = {}): Promise<Buffer> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'svc-bundle-'));
  try {
    const root = path.join(dir, 'root');
    await mkdir(root);
    for (const [name, content] of Object.entries(files)) {
      const target = path.join(root, name);
      await mkdir(path.dirname(target), { recursive: true });
      await writeFile(target, content, { mode: name.endsWith('.sh') ? 0o755 : 0o644 });
    }
    for (const [name, target] of Object.entries(options.links ?? {})) await symlink(target, path.join(root, name));
    const out = path.join(dir, 'bundle.tar.gz');
    await create({ gzip: true, file: out, cwd: root, portable: true }, [...Object.keys(files), ...Object.keys(options.links ?? {})]);
    return await readFile(out);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A gzip'd tar with an entry named `../escape.txt` or an absolute path: what a hostile client sends. */
export async function makeHostileBundle(kind: 'dotdot' | 'absolute'): Promise<Buffer> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'svc-bundle-'));
  try {
    const cwd = path.join(dir, 'root');
    await mkdir(cwd);
    await writeFile(path.join(dir, 'escape.txt'), 'x');
    const entry = kind === 'dotdot' ? '../escape.txt' : path.join(dir, 'escape.txt');
    const out = path.join(dir, 'bundle.tar.gz');
    await create({ gzip: true, file: out, cwd, preservePaths: true, portable: true }, [entry]);
    return await readFile(out);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

export function sha256(bytes: Buffer): string {
  return `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
}

/** POST /v1/agents with `metadata` (an object, or raw text) and `bundle` (omitted when null). */
export async function uploadAgent(server: TestServer, key: string, metadata: unknown, bundle: Buffer | null, headers: Record<string, string> = {}) {
  const form = new FormData();
  if (metadata !== undefined) form.append('metadata', typeof metadata === 'string' ? metadata : JSON.stringify(metadata));
  if (bundle) form.append('bundle', new Blob([new Uint8Array(bundle)], { type: 'application/gzip' }), 'bundle.tar.gz');
  return answer(await fetch(`${server.url}/v1/agents`, { method: 'POST', headers: { authorization: `Bearer ${key}`, ...headers }, body: form }));
}

/** POST /v1/bundles: a task-file bundle as the raw body. */
export async function uploadTaskFiles(server: TestServer, key: string, bundle: Buffer, headers: Record<string, string> = {}) {
  return answer(
    await fetch(`${server.url}/v1/bundles`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/gzip', ...headers },
      body: new Uint8Array(bundle),
    }),
  );
}

/** Status, body (parsed when JSON) and text of an answer. */
async function answer(res: Response): Promise<{ status: number; body: any; text: string }> {
  const text = await res.text();
  let body: any = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON
  }
  return { status: res.status, body, text };
}
