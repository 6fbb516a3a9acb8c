import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, stat, symlink } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { AuditLog, type AuditRecord } from '../../services/sandbox-runner/workspace/audit-log.ts';

let ws: string;
before(async () => {
  ws = await mkdtemp(path.join(os.tmpdir(), 'ws-audit-'));
});
after(() => rm(ws, { recursive: true, force: true }));

const redact = (text: string) => text.replaceAll('s3cr3t-value', '[REDACTED:API_KEY]');

test('records are JSON lines {ts, sandbox_id, type, details} in .svc/audit.jsonl, in call order, redacted', async () => {
  const published: AuditRecord[] = [];
  const log = new AuditLog({ workspace: ws, sandboxId: 'sb-abc', redact, onRecord: (r) => published.push(r) });
  const writes = [
    log.record('file_write', { path: 'a.txt', bytes: 3 }),
    log.record('process_spawn', { command: 'curl -H "Authorization: s3cr3t-value" x', exit_code: 0, duration_ms: 12 }),
    log.record('stdout', { text: 'token=s3cr3t-value\n"quoted"', nested: [{ 's3cr3t-value': 's3cr3t-value' }] }),
    log.record('http_call', { method: 'GET', host: 'api', path: '/', status: 200, duration_ms: 1, request_bytes: 0, response_bytes: 2 }),
  ];
  const records = (await Promise.all(writes)).map((r) => r!);
  await log.close();
  const text = await readFile(path.join(ws, '.svc', 'audit.jsonl'), 'utf8');
  assert.ok(!text.includes('s3cr3t-value'));
  const lines = text
    .trimEnd()
    .split('\n')
    .map((l) => JSON.parse(l));
  assert.equal(lines.length, 4);
  assert.deepEqual(lines, records);
  assert.deepEqual(published, records);
  assert.deepEqual(
    lines.map((l) => l.type),
    ['file_write', 'process_spawn', 'stdout', 'http_call'],
  );
  for (const l of lines) {
    assert.deepEqual(Object.keys(l), ['ts', 'sandbox_id', 'type', 'details']);
    assert.match(l.ts, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    assert.equal(l.sandbox_id, 'sb-abc');
  }
  assert.equal(lines[1].details.command, 'curl -H "Authorization: [REDACTED:API_KEY]" x');
  assert.deepEqual(lines[2].details, { text: 'token=[REDACTED:API_KEY]\n"quoted"', nested: [{ '[REDACTED:API_KEY]': '[REDACTED:API_KEY]' }] });
  assert.equal((await stat(path.join(ws, '.svc', 'audit.jsonl'))).mode & 0o777, 0o644);
  assert.deepEqual(await AuditLog.read(ws), records);
  await assert.rejects(log.record('warning', { message: 'late' }), /closed/);
});

test('a second log appends; an onRecord failure does not break auditing; unknown types are refused', async () => {
  const log = new AuditLog({
    workspace: ws,
    sandboxId: 'sb-abc',
    onRecord: () => {
      throw new Error('listener');
    },
  });
  await log.record('warning', { message: 'x' }, { ts: new Date('2024-01-02T03:04:05.006Z') });
  await assert.rejects(log.record('bogus' as never, {}), /unknown audit type/);
  await log.close();
  const all = await AuditLog.read(ws);
  assert.equal(all.length, 5);
  assert.equal(all[4]!.ts, '2024-01-02T03:04:05.006Z');
});

test('a .svc/audit.jsonl symlink is not followed', async () => {
  const other = await mkdtemp(path.join(os.tmpdir(), 'ws-audit2-'));
  try {
    await mkdir(path.join(other, '.svc'));
    await symlink('/tmp/elsewhere', path.join(other, '.svc', 'audit.jsonl'));
    const log = new AuditLog({ workspace: other, sandboxId: 'sb-x' });
    await assert.rejects(log.record('warning', {}), /ELOOP/);
    await log.close();
  } finally {
    await rm(other, { recursive: true, force: true });
  }
});

test('the log is empty before anything is recorded', async () => {
  assert.deepEqual(await AuditLog.read(path.join(ws, 'nowhere')), []);
});

test('a flood is bounded: at most recordsPerSecond a second, the rest counted by type in one warning per window; at most maxRecords in all', async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'ws-audit-flood-'));
  try {
    const published: AuditRecord[] = [];
    const log = new AuditLog({ workspace: dir, sandboxId: 'sb-f', recordsPerSecond: 5, maxRecords: 12, onRecord: (r) => published.push(r) });
    const first = await Promise.all([
      ...Array.from({ length: 20 }, (_, i) => log.record('file_write', { path: `w${i}` })),
      ...Array.from({ length: 10 }, (_, i) => log.record('file_delete', { path: `d${i}` })),
    ]);
    assert.equal(first.filter((r) => r !== null).length, 5, 'five of the first window are written');
    assert.deepEqual(log.dropped, { file_write: 15, file_delete: 10 }, 'what the forbidden rules cannot see');
    // The window's summary comes when it ends, with nothing more recorded.
    await new Promise((r) => setTimeout(r, 1100));
    let records = await AuditLog.read(dir);
    const summary = records.find((r) => r.type === 'warning')!;
    assert.deepEqual(summary.details.dropped, { file_write: 15, file_delete: 10 });
    assert.match(String(summary.details.message), /25 audit records dropped: more than 5 in one second/);
    assert.ok(Date.parse(String(summary.details.to)) - Date.parse(String(summary.details.from)) === 1000);
    // Past maxRecords (the summary counts too), everything is dropped; one warning says so, one at close counts it.
    for (let second = 0; second < 2; second++) {
      await Promise.all(Array.from({ length: 8 }, (_, i) => log.record('file_read', { path: `r${second}-${i}` })));
      await new Promise((r) => setTimeout(r, 1000));
    }
    await log.close();
    records = await AuditLog.read(dir);
    const warnings = records.filter((r) => r.type === 'warning');
    assert.ok(records.length <= 12 + 3, `${records.length} records`);
    assert.ok(
      warnings.some((w) => /the audit log is full \(12 records\)/.test(String(w.details.message))),
      JSON.stringify(warnings),
    );
    const last = records.at(-1)!;
    assert.equal(last.type, 'warning');
    assert.match(String(last.details.message), /dropped after the log was full/);
    assert.ok((last.details.dropped as Record<string, number>).file_read > 0);
    assert.deepEqual(published, records, 'only what is written is published');
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
