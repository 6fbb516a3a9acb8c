/**
 * The one cache of parsed specs (services/domain/spec-cache.ts): a text is parsed once and its
 * document shared; a text that fails fails again with the same error; a reader that cannot parse
 * a text hears of it once.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { stringify } from 'yaml';
import { parsedSpec, readableSpec } from '../../services/domain/spec-cache.ts';
import { parseSpec } from '../../services/domain/spec.ts';

const specText = (id: string) =>
  stringify({
    version: 1,
    id,
    base: 'debian:bookworm',
    task: { prompt: 'Fix it' },
    invariants: { tests_pass: { check: { type: 'command_exit', command: 'pytest -q' } } },
  });

test('a text is parsed once: the same document, equal to what parseSpec makes', () => {
  const yaml = specText('cached-once');
  const doc = parsedSpec(yaml);
  assert.equal(parsedSpec(yaml), doc);
  assert.equal(
    readableSpec(yaml, () => assert.fail('it parses')),
    doc,
  );
  assert.deepEqual(doc, parseSpec(yaml));
  assert.notEqual(parsedSpec(specText('another')), doc);
  assert.equal(parsedSpec(specText('another')).id, 'another');
});

test('a text that fails throws what parseSpec throws, the same error each time', () => {
  const yaml = `${specText('broken')}unknown_block: 1\n`;
  const thrown = (): unknown => {
    try {
      parsedSpec(yaml);
    } catch (err) {
      return err;
    }
    return assert.fail('it should throw');
  };
  const first = thrown();
  assert.throws(() => parseSpec(yaml), { message: (first as Error).message });
  assert.equal(thrown(), first);
});

test('readableSpec: null for a text that fails, told once', () => {
  const yaml = `${specText('unreadable')}unknown_block: 2\n`;
  const heard: string[] = [];
  assert.equal(
    readableSpec(yaml, (err) => heard.push(err.message)),
    null,
  );
  assert.equal(
    readableSpec(yaml, (err) => heard.push(err.message)),
    null,
  );
  assert.equal(heard.length, 1);
  assert.match(heard[0], /unknown_block/);
  assert.throws(() => parsedSpec(yaml), { message: heard[0] });
});
