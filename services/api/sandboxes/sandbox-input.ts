/**
 * The bodies of the sandbox endpoints, read into what the operations take (sandbox-operations.ts);
 * a bad field is a 400 naming it. Durations are bounded by the maximum sandbox lifetime
 * (domain/sandbox-lifetime.ts).
 */
import { isUtf8 } from 'node:buffer';
import { badRequest } from '../../kernel/errors.ts';
import { sandboxDuration } from '../../domain/sandbox-lifetime.ts';
import { commandSizeProblem } from '../../domain/sandbox-limits.ts';
import { FILE_MODE_TEXT, isBase64, SECRET_NAME } from '../../domain/spec.ts';

type Body = Record<string, unknown>;

/** A sandbox to create: a stored spec, and what the request adds to it. */
export interface CreateInput {
  specId: string;
  /** Null: the spec's own timeout. */
  timeoutMs: number | null;
  metadata: Record<string, string>;
  secrets: Record<string, string>;
}

/** A request's duration, bounded by the maximum sandbox lifetime; null when absent. */
function duration(value: unknown, field: string, maxLifetimeMs: number): number | null {
  return value === undefined || value === null ? null : sandboxDuration(value, field, maxLifetimeMs);
}

function stringMap(value: unknown, field: string, key?: RegExp): Record<string, string> {
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) throw badRequest(field, 'must be an object of string values');
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string') throw badRequest(`${field}.${k}`, 'must be a string');
    if (key && !key.test(k)) throw badRequest(`${field}.${k}`, 'is not a valid name (letters, digits and _)');
  }
  return value as Record<string, string>;
}

/** POST /v1/sandboxes. */
export function createInput(b: Body, maxLifetimeMs: number): CreateInput {
  if (typeof b.spec_id !== 'string' || b.spec_id === '') throw badRequest('spec_id', 'is required: the id of a stored spec');
  const timeoutMs = duration(b.timeout, 'timeout', maxLifetimeMs);
  const metadata = stringMap(b.metadata, 'metadata');
  const reserved = Object.keys(metadata).find((k) => k.startsWith('svc.'));
  if (reserved) throw badRequest(`metadata.${reserved}`, 'keys starting with "svc." are reserved for the service');
  const secrets = stringMap(b.secrets, 'secrets', SECRET_NAME);
  return { specId: b.spec_id, timeoutMs, metadata, secrets };
}

/** POST /v1/sandboxes/:id/commands: the runner's `command` payload. */
export function commandInput(b: Body, maxLifetimeMs: number): { command: string; timeout_ms: number | null; background: boolean } {
  if (typeof b.command !== 'string' || b.command.trim() === '') throw badRequest('command', 'is required: a shell command string');
  const tooLong = commandSizeProblem(b.command);
  if (tooLong) throw badRequest('command', tooLong);
  if (b.background !== undefined && typeof b.background !== 'boolean') throw badRequest('background', 'must be true or false');
  return { command: b.command, timeout_ms: duration(b.timeout, 'timeout', maxLifetimeMs), background: b.background === true };
}

/** How a file's content travels in JSON: as its text, or as the base64 of its bytes. */
export type FileEncoding = 'utf8' | 'base64';

/** An `encoding` field or query parameter: utf8 when absent. */
export function fileEncoding(value: unknown): FileEncoding {
  if (value === undefined) return 'utf8';
  if (value !== 'utf8' && value !== 'base64') throw badRequest('encoding', 'must be utf8 or base64');
  return value;
}

/** POST /v1/sandboxes/:id/files: the runner's `file_write` payload; `mode` an octal string ("0755"), as in the spec. */
export function fileWriteInput(b: Body): { path: string; content: string; encoding: FileEncoding; mode?: number } {
  if (typeof b.path !== 'string' || b.path === '') throw badRequest('path', 'is required');
  const encoding = fileEncoding(b.encoding);
  if (typeof b.content !== 'string') throw badRequest('content', `is required: the file content as a string${encoding === 'base64' ? ' of base64' : ''}`);
  if (encoding === 'base64' && !isBase64(b.content)) throw badRequest('content', 'is not valid base64 (standard, padded: A-Z, a-z, 0-9, + and /)');
  if (b.mode !== undefined && (typeof b.mode !== 'string' || !FILE_MODE_TEXT.test(b.mode)))
    throw badRequest('mode', 'must be an octal file mode as a string, such as "0644" or "0755"');
  return { path: b.path, content: b.content, encoding, ...(b.mode !== undefined && { mode: parseInt(b.mode as string, 8) }) };
}

/** GET /v1/sandboxes/:id/files/*path?encoding=: the file's bytes as JSON `{path, bytes, encoding, content}`. */
export function fileJson(path: string, data: Buffer, encoding: FileEncoding): { path: string; bytes: number; encoding: FileEncoding; content: string } {
  // Named as the runner names it (it refused anything else): workspace-relative.
  const relative = path.replace(/^\/workspace\//, '');
  if (encoding === 'utf8' && !isUtf8(data)) throw badRequest('encoding', `${relative} is not valid UTF-8; read it with encoding=base64`);
  return { path: relative, bytes: data.length, encoding, content: data.toString(encoding) };
}

/** The `*path` of /v1/sandboxes/:id/files/*path: `/workspace/foo` and `foo` are one file; the runner checks the rest of the rules. */
export function filePath(raw: unknown): string {
  const joined = Array.isArray(raw) ? raw.join('/') : raw;
  if (typeof joined !== 'string' || joined === '') throw badRequest('path', 'is required');
  return joined;
}

/** POST /v1/sandboxes/:id/timeout: `timeout_ms` (reset the timer) or `extend_ms` (add to it). */
export function timeoutChange(b: Body, maxLifetimeMs: number): { timeout_ms?: number; extend_ms?: number } {
  if ((b.timeout === undefined) === (b.extend === undefined))
    throw badRequest('timeout', 'give either timeout (reset the timer to this long from now) or extend (add this much)');
  const field = b.timeout !== undefined ? 'timeout' : 'extend';
  return { [`${field}_ms`]: sandboxDuration(b[field], field, maxLifetimeMs) };
}
