/**
 * The one duration parser (services/kernel/duration.ts): the lenient grammar of settings, specs
 * and request bodies, the whole-number grammar of the topic catalog and alert windows, and the
 * format messages use. Its callers keep their own messages (schema-serde.test.ts, alerts.test.ts).
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { formatDuration, parseDuration } from '../../services/kernel/duration.ts';

describe('lenient grammar (the default)', () => {
  test('ms strings, decimals, long unit names and bare integers of seconds', () => {
    assert.equal(parseDuration('30s'), 30_000);
    assert.equal(parseDuration(' 5m '), 300_000);
    assert.equal(parseDuration('1.5h'), 5_400_000);
    assert.equal(parseDuration('2 days'), 172_800_000);
    assert.equal(parseDuration('250ms'), 250);
    assert.equal(parseDuration('45'), 45_000);
    assert.equal(parseDuration(90), 90_000);
    assert.equal(parseDuration(0), 0);
  });

  test('anything else is an error saying what is expected', () => {
    for (const bad of ['', 'soon', '5 parsecs', '-5s', 's'])
      assert.throws(() => parseDuration(bad), /^Error: expected a duration such as 30s, 5m, 1h or an integer of seconds, got "/, bad);
    for (const bad of [-1, 1.5]) assert.throws(() => parseDuration(bad), /^Error: expected a duration such as 30s, 5m or an integer of seconds, got -?1/);
  });
});

describe('whole grammar', () => {
  test('a whole number and one of ms, s, m, h, d, w', () => {
    assert.equal(parseDuration('250ms', 'whole'), 250);
    assert.equal(parseDuration('45s', 'whole'), 45_000);
    assert.equal(parseDuration('30 m', 'whole'), 1_800_000);
    assert.equal(parseDuration(' 24h', 'whole'), 86_400_000);
    assert.equal(parseDuration('7d', 'whole'), 604_800_000);
    assert.equal(parseDuration('2w', 'whole'), 1_209_600_000);
    assert.equal(parseDuration('0s', 'whole'), 0);
  });

  test('no bare numbers, decimals, long names or other cases', () => {
    for (const bad of ['45', '1.5h', '7 days', '7D', 'forever', ''])
      assert.throws(() => parseDuration(bad, 'whole'), /^Error: expected a whole number and a unit \(ms, s, m, h, d or w\) such as 7d, got "/, bad);
    assert.throws(() => parseDuration(45, 'whole'), /got 45$/);
  });
});

test('formatDuration: the largest unit that divides evenly, weeks only when asked', () => {
  assert.equal(formatDuration(86_400_000), '1d');
  assert.equal(formatDuration(5_400_000), '90m');
  assert.equal(formatDuration(604_800_000), '7d');
  assert.equal(formatDuration(604_800_000, 'w'), '1w');
  assert.equal(formatDuration(30 * 86_400_000, 'w'), '30d');
  assert.equal(formatDuration(1500), '1500ms');
});
