import assert from 'node:assert/strict';
import { test } from 'node:test';
import { formatTimestampUs, parseTimestampUs, validateTraceBatch } from '../../services/api/traces/validate-events.ts';
import { eventIds } from '../../services/kernel/ids.ts';
import { truncateUtf8 } from '../../services/kernel/tenant-secrets.ts';

const limits = { maxEvents: 1000, maxFieldBytes: 4096 };
const ev = (o: Record<string, unknown> = {}) => ({ ts: '2026-01-01T00:00:00Z', event_type: 'tool_call', tool: 't', phase: 'complete', span_id: 's', ...o });

test('timestamps: zones, fractions to nanoseconds, microseconds kept', () => {
  assert.equal(parseTimestampUs('2026-01-01T00:00:00Z'), Date.UTC(2026, 0, 1) * 1000);
  assert.equal(parseTimestampUs('2026-01-01T01:00:00.000001+01:00'), Date.UTC(2026, 0, 1) * 1000 + 1);
  assert.equal(parseTimestampUs('2026-01-01T00:00:00.123456789Z'), Date.UTC(2026, 0, 1) * 1000 + 123456);
  for (const bad of ['2026-01-01', '2026-01-01T00:00:00', 'yesterday', 1700000000, '2026-13-01T00:00:00Z']) {
    assert.equal(parseTimestampUs(bad), null, String(bad));
  }
  assert.equal(formatTimestampUs(Date.UTC(2026, 0, 1) * 1000 + 123456), '2026-01-01T00:00:00.123456Z');
  assert.equal(formatTimestampUs(Date.UTC(2026, 0, 1) * 1000 + 123000), '2026-01-01T00:00:00.123Z');
});

test('truncation keeps whole UTF-8 characters', () => {
  assert.equal(truncateUtf8('abc', 2), 'ab');
  assert.equal(truncateUtf8('aé', 2), 'a', 'é is two bytes: it is dropped, not split');
  assert.equal(truncateUtf8('a😀b', 4), 'a');
  assert.equal(truncateUtf8('a😀b', 5), 'a😀');
  assert.equal(Buffer.byteLength(truncateUtf8('é'.repeat(5000), 4096)), 4096);
});

test('trace ids follow parent links to the root within a batch', () => {
  const events = validateTraceBatch(
    [
      ev({ span_id: 'root' }),
      ev({ span_id: 'child', parent_span_id: 'root' }),
      ev({ span_id: 'grandchild', parent_span_id: 'child' }),
      ev({ span_id: 'orphan', parent_span_id: 'elsewhere' }),
      ev({ span_id: 'given', trace_id: 'T' }),
      ev({ span_id: 'under-given', parent_span_id: 'given' }),
    ],
    limits,
  );
  assert.deepEqual(
    events.map((e) => e.trace_id),
    ['root', 'root', 'root', 'elsewhere', 'T', 'T'],
  );
});

test('a parent cycle does not hang', () => {
  const events = validateTraceBatch([ev({ span_id: 'a', parent_span_id: 'b' }), ev({ span_id: 'b', parent_span_id: 'a' })], limits);
  assert.equal(events.length, 2);
});

test('server-made event ids: random without a seed, the same for the same seed and position, client ids kept', () => {
  const batch = [ev({ span_id: 'a' }), ev({ span_id: 'b', event_id: 'client-1' }), ev({ span_id: 'c' })];
  const ids = (seed: string | null) => validateTraceBatch(batch, limits, eventIds(seed)).map((e) => e.event_id);
  const [random1, random2] = [ids(null), ids(null)];
  assert.notEqual(random1[0], random2[0]);
  const seeded = ids('seed-1');
  assert.deepEqual(ids('seed-1'), seeded, 'a retry makes the same ids');
  assert.equal(seeded[1], 'client-1');
  assert.notEqual(seeded[0], seeded[2], 'each position its own id');
  assert.match(seeded[0]!, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
  assert.notDeepEqual(ids('seed-2'), seeded, 'another request, other ids');
});
