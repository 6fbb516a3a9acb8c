/**
 * The spec parser under fuzzing: an odd value at every path of a full document is refused with a
 * 400 or accepted, never a crash. In the slow tier (a few seconds: thousands of documents); the
 * spec's other cases are in test/unit/spec.test.ts.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { AppError } from '../../services/kernel/errors.ts';
import { parseSpec } from '../../services/domain/spec.ts';
import { everyBlock } from '../helpers/spec-documents.ts';

test('odd values at every path of a full document are 400s or valid, never a crash', () => {
  // JSON is YAML (and much faster to write); .nan and .inf are YAML only.
  const oddValues: string[] = [
    'null',
    '[]',
    '{}',
    '42',
    '-1',
    '1.5',
    '""',
    '"str"',
    'true',
    '.nan',
    '.inf',
    '[[[[[[]]]]]]',
    '{"a": {"b": {}}}',
    '"{{ params.nope }}"',
  ];
  const paths: Array<Array<string | number>> = [];
  const collect = (value: unknown, path: Array<string | number>) => {
    paths.push(path);
    if (Array.isArray(value)) for (const [i, v] of value.entries()) collect(v, [...path, i]);
    else if (typeof value === 'object' && value !== null) for (const [k, v] of Object.entries(value)) collect(v, [...path, k]);
  };
  collect(everyBlock(), []);
  let refused = 0;
  // Each path gets five of the odd values, in rotation, so every value meets every kind of field.
  for (const [n, path] of paths.entries()) {
    for (const odd of Array.from({ length: 5 }, (_, k) => oddValues[(n * 5 + k) % oddValues.length])) {
      if (path.length === 0) continue;
      const doc = structuredClone(everyBlock()) as Record<string | number, unknown>;
      let parent: Record<string | number, unknown> = doc;
      for (const key of path.slice(0, -1)) parent = parent[key] as Record<string | number, unknown>;
      const marker = '\u0001odd\u0001';
      parent[path[path.length - 1]] = marker;
      try {
        parseSpec(JSON.stringify(doc).replace(JSON.stringify(marker), odd));
      } catch (err) {
        assert.ok(err instanceof AppError && err.status === 400, `${path.join('.')} = ${odd}: ${String(err)}`);
        refused++;
      }
    }
  }
  assert.ok(refused > paths.length, 'most odd values are refused');
});
