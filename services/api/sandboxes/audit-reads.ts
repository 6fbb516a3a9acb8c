/**
 * A sandbox's audit records as stored in ClickHouse (audit_events, the sink's projection of
 * svc.audit), so they outlive the sandbox: GET /v1/sandboxes/:id/audit and the export bundle of
 * an experiment read them here. docs/sandboxes.md ("Reading the audit log") documents the endpoint.
 *
 * Order: by the record's time (`ts`, ms), then by the record's position on svc.audit
 * (LogPartition, LogOffset). A sandbox's records share one partition (its id is the key) and the
 * runner appends each as it writes it to its audit file, so records of one millisecond keep the
 * file's order; the position is unique (the sink stores each log record once), so the keyset
 * cursor [ts, partition, offset] is stable while new records arrive.
 */
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError, badRequest, notFound } from '../../kernel/errors.ts';
import type { Store } from '../../kernel/store/store.ts';
import { AUDIT_TYPES } from '../../domain/events/sandbox-events.ts';
import type { SandboxCatalog } from '../catalogs/sandbox-catalog.ts';
import { parseTimestampUs } from '../traces/validate-events.ts';
import type { FetchPage } from '../traces/paged-answer.ts';

/** The query parameters of GET /v1/sandboxes/:id/audit besides limit, cursor and format. */
export const AUDIT_FILTERS = ['type', 'since'] as const;

/** The cursor: [ts in ms, log partition, log offset] of a page's last record. */
export const AUDIT_CURSOR_ARITY = 3;

const TABLE = 'audit_events';

/** One audit record as the API shows it: a line of `.svc/audit.jsonl`. */
export interface AuditItem {
  ts: string;
  sandbox_id: string;
  type: string;
  details: Record<string, unknown>;
}

export interface AuditFilters {
  /** Only these types (none: every type). */
  types: string[] | null;
  /** Only records at or after this time, in µs since the epoch. */
  sinceUs: number | null;
}

export const NO_AUDIT_FILTERS: AuditFilters = { types: null, sinceUs: null };

/** Whose audit log is read: the sandbox and its tenant. */
export interface AuditSubject {
  tenant: string;
  sandboxId: string;
}

interface AuditRow {
  ts_ms: string;
  LogPartition: number | string;
  LogOffset: string;
  Type: string;
  Details: string;
}

/** The filters of the query (checked against AUDIT_FILTERS by the router): a bad value is a 400 naming it. */
export function auditFilters(q: Readonly<Record<string, unknown>>): AuditFilters {
  let types: string[] | null = null;
  if (q.type !== undefined) {
    types = String(q.type)
      .split(',')
      .map((t) => t.trim());
    const unknown = types.filter((t) => !(AUDIT_TYPES as readonly string[]).includes(t));
    if (unknown.length > 0)
      throw badRequest(
        'type',
        `${unknown.map((t) => JSON.stringify(t)).join(', ')} is not an audit type; one or more (comma-separated) of ${AUDIT_TYPES.join(', ')}`,
      );
  }
  let sinceUs: number | null = null;
  if (q.since !== undefined) {
    sinceUs = parseTimestampUs(q.since);
    if (sinceUs === null) throw badRequest('since', 'must be an ISO 8601 timestamp with a zone, e.g. 2026-01-01T00:00:00.000Z');
  }
  return { types, sinceUs };
}

/**
 * The sandbox whose audit log the principal may read, as every sandbox endpoint decides: its
 * tenant's keys (the admin key acts as the default tenant), or its own sandbox token. The live
 * view knows every sandbox it has seen, ended ones too; one it does not know (a view that has
 * forgotten it) is looked up in the sandboxes table, which keeps its tenant. 404 when neither
 * knows the id, 403 when it is another tenant's (or another sandbox's, for a sandbox token).
 */
export async function auditSubject(store: Store, sandboxes: SandboxCatalog, principal: Principal, id: string): Promise<AuditSubject> {
  try {
    const live = sandboxes.owned(principal, id, { allowGone: true });
    return { tenant: live.tenant, sandboxId: live.sandbox_id };
  } catch (err) {
    if (!(err instanceof AppError && err.code === 'not_found')) throw err;
  }
  const mine = await store.query<{ n: string }>('SELECT count() AS n FROM sandboxes WHERE TenantId = {tenant:String} AND SandboxId = {id:String}', {
    tenant: principal.tenant,
    id,
  });
  const ownSandbox = principal.kind !== 'sandbox' || principal.keyId === id;
  if (Number(mine[0]?.n ?? 0) > 0 && ownSandbox) return { tenant: principal.tenant, sandboxId: id };
  // Whether the id exists at all (for anyone) decides between 403 and 404: sandbox ids are global.
  const anyone = await store.query<{ n: string }>('SELECT count() AS n FROM sandboxes WHERE SandboxId = {id:String}', { id });
  if (Number(anyone[0]?.n ?? 0) === 0) throw notFound('sandbox', id);
  throw new AppError('forbidden', `sandbox ${id} belongs to another ${principal.kind === 'sandbox' ? 'sandbox' : 'tenant'}`);
}

/**
 * The pages of a sandbox's audit log, once the sink has stored every record on the sandbox's
 * partition of svc.audit as of now: a record the runner appended before the request (before a
 * command or a destroy answered, in practice) is in them. Waiting here, before any page is
 * read, makes a sink that stays behind a 504 rather than an NDJSON stream cut short.
 */
export async function auditPages(kernel: Kernel, subject: AuditSubject, filters: AuditFilters): Promise<FetchPage<AuditItem>> {
  await auditStored(kernel, subject.sandboxId);
  return (after, pageSize) => auditPage(kernel.store, subject, filters, after, pageSize);
}

/**
 * Resolves once the sink has stored every audit record on svc.audit as of now: of one sandbox
 * (its partition) or of all. A 504 `timeout` when the sink stays behind for SVC_REPLY_TIMEOUT.
 */
export function auditStored(kernel: Kernel, sandboxId: string | null): Promise<void> {
  return kernel.visibility.waitForTable(TABLE, sandboxId, kernel.config.replyTimeout);
}

function itemOf(row: AuditRow, sandboxId: string): AuditItem {
  return { ts: new Date(Number(row.ts_ms)).toISOString(), sandbox_id: sandboxId, type: row.Type, details: JSON.parse(row.Details) as Record<string, unknown> };
}

const keyOf = (row: AuditRow): string[] => [String(row.ts_ms), String(row.LogPartition), String(row.LogOffset)];

/** The conditions and parameters of one read: the subject, the filters, and the keyset after `after`. */
function conditions(subject: AuditSubject, filters: AuditFilters, after: string[] | null): { where: string; params: Record<string, unknown> } {
  const where = ['TenantId = {tenant:String}', 'SandboxId = {sandbox:String}'];
  const params: Record<string, unknown> = { tenant: subject.tenant, sandbox: subject.sandboxId };
  if (filters.types) {
    where.push('Type IN {types:Array(String)}');
    params.types = filters.types;
  }
  if (filters.sinceUs !== null) {
    where.push('Timestamp >= fromUnixTimestamp64Micro({since:Int64})');
    params.since = filters.sinceUs;
  }
  if (after) {
    // The redundant lower bound lets the primary key serve the tuple comparison.
    where.push('Timestamp >= fromUnixTimestamp64Milli({after_ts:Int64})');
    where.push('(Timestamp, LogPartition, LogOffset) > (fromUnixTimestamp64Milli({after_ts:Int64}), {after_partition:UInt32}, {after_offset:UInt64})');
    Object.assign(params, { after_ts: Number(after[0]), after_partition: Number(after[1]), after_offset: Number(after[2]) });
  }
  return { where: where.join(' AND '), params };
}

/**
 * One page of the subject's audit records after the key `after` (a decoded cursor), in the
 * order above; `next` is the key of the page's last record when more follow. A row stored twice
 * (an insert retried) has the same key as its twin, comes right after it, and is dropped.
 */
export async function auditPage(
  store: Store,
  subject: AuditSubject,
  filters: AuditFilters,
  after: string[] | null,
  pageSize: number,
): Promise<{ items: AuditItem[]; next: string[] | null }> {
  if (after && !after.every((k) => /^\d{1,16}$/.test(k))) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  const want = pageSize + 1;
  const rows: AuditRow[] = [];
  let from = after;
  for (;;) {
    const limit = want - rows.length;
    const { where, params } = conditions(subject, filters, from);
    const batch = await store.query<AuditRow>(
      `SELECT toUnixTimestamp64Milli(Timestamp) AS ts_ms, LogPartition, LogOffset, Type, Details FROM ${TABLE}
       WHERE ${where} ORDER BY Timestamp, LogPartition, LogOffset LIMIT {page:UInt32}`,
      { ...params, page: limit },
    );
    for (const row of batch) if (rows.length === 0 || keyOf(rows[rows.length - 1]).join() !== keyOf(row).join()) rows.push(row);
    if (batch.length < limit || rows.length >= want) break;
    from = keyOf(batch[batch.length - 1]);
  }
  const last = rows.length > pageSize ? rows[pageSize - 1] : null;
  return { items: rows.slice(0, pageSize).map((r) => itemOf(r, subject.sandboxId)), next: last ? keyOf(last) : null };
}

/** Every audit record of the subject, a page at a time (the export bundle streams them). */
export async function* allAuditRecords(store: Store, subject: AuditSubject, pageSize: number): AsyncGenerator<AuditItem[]> {
  let after: string[] | null = null;
  do {
    const page = await auditPage(store, subject, NO_AUDIT_FILTERS, after, pageSize);
    if (page.items.length > 0) yield page.items;
    after = page.next;
  } while (after !== null);
}
