import assert from 'node:assert/strict';
import { test } from 'node:test';
import { checkJsonDepth, MAX_JSON_DEPTH } from '../../services/api/json-depth.ts';

const nested = (depth: number) => `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`;
const problem = (text: string, field?: string) => {
  try {
    checkJsonDepth(text, field);
    return null;
  } catch (err) {
    return (err as Error).message;
  }
};

test('up to the limit passes; one level more is a 400 naming where, with the first levels of the path', () => {
  assert.equal(problem(nested(MAX_JSON_DEPTH)), null);
  assert.equal(problem(nested(MAX_JSON_DEPTH + 1)), `a.a.a.a.a.a.a.a.a.a…: nests objects and arrays deeper than ${MAX_JSON_DEPTH} levels`);
  assert.match(problem(`{"events":[{"ts":"x"},{"metadata":${nested(200)}}]}`)!, /^events\[1\]\.metadata\.a\.a/);
  assert.match(problem(`[${nested(200)}]`)!, /^body\[0\]\.a/);
  assert.match(problem(nested(200), 'metadata')!, /^metadata\.a\.a/);
});

test('brackets, quotes and escapes inside strings are text, not structure', () => {
  assert.equal(problem(JSON.stringify({ s: '['.repeat(500) + '{"'.repeat(500), t: '\\"[[[' })), null);
  assert.match(problem(`{"k\\"[":{"b\\\\":${nested(200)}}}`)!, /^k"\[\.b\\\.a/);
  // Malformed text is the parser's to report.
  assert.equal(problem('{"a": [1, 2'), null);
});
