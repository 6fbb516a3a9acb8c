import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { redactSecrets, Sealer } from '../../services/kernel/tenant-secrets.ts';

const SECRETS = { API_KEY: 'sk-live-0123456789abcdef', PIN: '123' };

test('redactSecrets replaces every whole value of 4+ characters, by name', () => {
  assert.equal(redactSecrets('a sk-live-0123456789abcdef b sk-live-0123456789abcdef 123', SECRETS), 'a [REDACTED:API_KEY] b [REDACTED:API_KEY] 123');
  assert.equal(redactSecrets('nothing here', {}), 'nothing here');
});

test('a value holding another is replaced whole', () => {
  assert.equal(redactSecrets('token=abcd-efgh-ijkl', { SHORT: 'abcd', LONG: 'abcd-efgh-ijkl' }), 'token=[REDACTED:LONG]');
});

test('a value is found escaped inside JSON text too', () => {
  const value = 'p"a\\ss\nword';
  assert.equal(redactSecrets(JSON.stringify({ v: `x${value}y` }), { PASS: value }), '{"v":"x[REDACTED:PASS]y"}');
});

test('text cut at its end loses a tail that begins a value; uncut text keeps it', () => {
  assert.equal(redactSecrets('output sk-live-0123', SECRETS, { cut: true }), 'output ');
  assert.equal(redactSecrets('output s', SECRETS, { cut: true }), 'output ');
  assert.equal(redactSecrets('output sk-live-0123', SECRETS), 'output sk-live-0123');
  assert.equal(redactSecrets('output done', SECRETS, { cut: true }), 'output done');
  // A character split by the cut decodes as U+FFFD, which must not shield the value's beginning.
  assert.equal(redactSecrets('out Pässw\uFFFD', { PASS: 'Pässwörd' }, { cut: true }), 'out ');
  // Values too short to redact leave nothing to hide.
  assert.equal(redactSecrets('pin 12', SECRETS, { cut: true }), 'pin 12');
});

test('maxBytes redacts first, then cuts at a character boundary, then drops a partial value', () => {
  const filler = 'x'.repeat(10);
  const text = `${filler}sk-live-0123456789abcdef tail`;
  // The whole value fits before the cut: it is replaced, and the marker is what gets cut.
  assert.equal(redactSecrets(text, SECRETS, { maxBytes: 30 }), `${filler}[REDACTED:API_KEY] t`);
  // Redacting can make a cut unnecessary.
  assert.equal(redactSecrets(`${filler}sk-live-0123456789abcdef`, { K: 'sk-live-0123456789abcdef' }, { maxBytes: 24 }), `${filler}[REDACTED:K]`);
  // What the cut leaves looking like a value's beginning goes.
  assert.equal(redactSecrets(`${filler}sk-live-01 and more`, SECRETS, { maxBytes: 16 }), filler);
  assert.equal(Buffer.byteLength(redactSecrets('é'.repeat(100), SECRETS, { maxBytes: 51 })), 50);
  assert.equal(redactSecrets('short', SECRETS, { maxBytes: 100 }), 'short');
});

test('the Sealer seals strings and bytes, bound to their context', () => {
  const sealer = new Sealer(randomBytes(32));
  const bytes = randomBytes(1000);
  const sealed = sealer.seal(bytes, 'reply/1');
  assert.ok(!sealed.includes(bytes.subarray(0, 16)));
  assert.deepEqual(sealer.openBytes(sealed, 'reply/1'), bytes);
  assert.equal(sealer.open(sealer.seal('héllo', 'x'), 'x'), 'héllo');
  assert.throws(() => sealer.openBytes(sealed, 'reply/2'), /unable to authenticate/);
});
