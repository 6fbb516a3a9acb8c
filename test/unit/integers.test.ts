/** The e2e suite's integer check (test/helpers/integers.ts) finds what it must and only that. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { nonIntegers } from '../helpers/integers.ts';

test('a float in an integer field is found at any depth, by path', () => {
  const body = { items: [{ exit_code: 0, duration_ms: 1004.3898090000002, events: [{ seq: 2, data: { status: 200.5 } }] }], count: 1 };
  assert.deepEqual(nonIntegers(body), ['items[0].duration_ms = 1004.3898090000002', 'items[0].events[0].data.status = 200.5']);
  assert.deepEqual(nonIntegers([{ output_bytes: 1.5 }]), ['[0].output_bytes = 1.5']);
});

test('integers, strings and aggregates pass', () => {
  assert.deepEqual(nonIntegers({ duration_ms: 1004, status: 'completed', mean_duration_ms: 12.5, p95_wall_ms: 3.25, pass_rate: 0.75, count: 0 }), []);
});
