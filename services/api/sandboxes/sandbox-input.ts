/**
 * The bodies of the sandbox endpoints, read into what the operations take (sandbox-operations.ts);
 * a bad field is a 400 naming it. Durations are bounded by the maximum sandbox lifetime
 * (domain/sandbox-lifetime.ts).
 */
import { badRequest } from '../../kernel/errors.ts';
import { sandboxDuration } from '../../domain/sandbox-lifetime.ts';
import { commandSizeProblem } from '../../domain/sandbox-limits.ts';
import { SECRET_NAME } from '../../domain/spec.ts';

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

/** POST /v1/sandboxes/:id/files: the runner's `file_write` payload. */
export function fileWriteInput(b: Body): { path: string; content: string } {
  if (typeof b.path !== 'string' || b.path === '') throw badRequest('path', 'is required');
  if (typeof b.content !== 'string') throw badRequest('content', 'is required: the file content as a string');
  return { path: b.path, content: b.content };
}

/** The `*path` of /v1/sandboxes/:id/files/*path: `/workspace/foo` and `foo` are one file; the runner checks the rest of the rules. */
export function filePath(raw: unknown): string {
  const joined = Array.isArray(raw) ? raw.join('/') : raw;
  if (typeof joined !== 'string' || joined === '') throw badRequest('path', 'is required');
  return joined;
}

/** POST /v1/sandboxes/:id/timeout: `timeout_ms` (reset the timer) or `extend_ms` (add to it). */
export function timeoutChange(b: Body, maxLifetimeMs: number): { timeout_ms?: number; extend_ms?: number } {
  if ((b.timeout === undefined) === (b.extend === undefined)) throw badRequest('timeout', 'give either timeout (reset the timer to this long from now) or extend (add this much)');
  const field = b.timeout !== undefined ? 'timeout' : 'extend';
  return { [`${field}_ms`]: sandboxDuration(b[field], field, maxLifetimeMs) };
}
