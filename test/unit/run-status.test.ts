/**
 * The run-status decision (services/domain/run-status.ts): each branch, from the facts read of a
 * run and what the aggregator observes (the time, the lease, the runners' restarts).
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runStatus, type Observed, type RunRecord } from '../../services/domain/run-status.ts';

const LEASE = 1000;
const observed = (now: number, runnerStarts: Record<string, number> = {}): Observed => {
  const starts = new Map(Object.entries(runnerStarts));
  return { now, leaseMs: LEASE, runnerStarts: starts, latestRunnerStart: Math.max(0, ...starts.values()) };
};
const record = (facts: Partial<RunRecord>): RunRecord => ({
  dispatched: new Map(),
  started: new Map(),
  rejected: new Set(),
  finished: false,
  scored: false,
  ...facts,
});

test('nothing read, or never dispatched: due, attempt 1', () => {
  assert.deepEqual(runStatus(null, observed(0)), { kind: 'due', attempt: 1, reason: 'new' });
  assert.deepEqual(runStatus(record({}), observed(0)), { kind: 'due', attempt: 1, reason: 'new' });
});

test('scored: done, whatever else was read; finished: waiting for its score', () => {
  const rejected = record({ dispatched: new Map([[1, 0]]), rejected: new Set([1]) });
  assert.deepEqual(runStatus({ ...rejected, scored: true, finished: true }, observed(10 * LEASE)), { kind: 'scored' });
  assert.deepEqual(runStatus({ ...rejected, finished: true }, observed(10 * LEASE)), { kind: 'finished' });
});

test('dispatched, within its lease, its runner alive: in flight, at its latest attempt', () => {
  const run = record({
    dispatched: new Map([
      [1, 100],
      [2, 200],
    ]),
    started: new Map([[2, { runner: 'r1', ts: 250 }]]),
  });
  assert.deepEqual(runStatus(run, observed(200 + LEASE, { r1: 240, r2: 900 })), { kind: 'in_flight', attempt: 2 });
});

test('rejected at its latest attempt: due again', () => {
  const run = record({
    dispatched: new Map([
      [1, 100],
      [2, 200],
    ]),
    rejected: new Set([1, 2]),
  });
  assert.deepEqual(runStatus(run, observed(300)), { kind: 'due', attempt: 3, reason: 'rejected' });
  // An earlier attempt's rejection does not count against the latest one.
  assert.deepEqual(runStatus({ ...run, rejected: new Set([1]) }, observed(300)), { kind: 'in_flight', attempt: 2 });
});

test('started, then its runner restarted or died: lost; another runner restarting does not matter', () => {
  const run = record({ dispatched: new Map([[1, 100]]), started: new Map([[1, { runner: 'r1', ts: 150 }]]) });
  assert.deepEqual(runStatus(run, observed(300, { r1: 200 })), { kind: 'due', attempt: 2, reason: 'lost' });
  assert.deepEqual(runStatus(run, observed(300, { r1: 150, r2: 290 })), { kind: 'in_flight', attempt: 1 });
});

test('not yet started, and any runner restarted after its dispatch: lost', () => {
  const run = record({ dispatched: new Map([[1, 100]]) });
  assert.deepEqual(runStatus(run, observed(300, { r2: 101 })), { kind: 'due', attempt: 2, reason: 'lost' });
  assert.deepEqual(runStatus(run, observed(300, { r2: 100 })), { kind: 'in_flight', attempt: 1 });
});

test('in flight longer than the lease: due again; at the lease exactly, still in flight', () => {
  const run = record({ dispatched: new Map([[1, 100]]), started: new Map([[1, { runner: 'r1', ts: 150 }]]) });
  assert.deepEqual(runStatus(run, observed(100 + LEASE + 1)), { kind: 'due', attempt: 2, reason: 'lease_expired' });
  assert.deepEqual(runStatus(run, observed(100 + LEASE)), { kind: 'in_flight', attempt: 1 });
});

test('of several reasons, a rejection is named first, then a loss', () => {
  const run = record({ dispatched: new Map([[1, 100]]), started: new Map([[1, { runner: 'r1', ts: 150 }]]), rejected: new Set([1]) });
  assert.deepEqual(runStatus(run, observed(10 * LEASE, { r1: 200 })), { kind: 'due', attempt: 2, reason: 'rejected' });
  assert.deepEqual(runStatus({ ...run, rejected: new Set() }, observed(10 * LEASE, { r1: 200 })), { kind: 'due', attempt: 2, reason: 'lost' });
});
