/**
 * Sandboxes end to end on the `local` runtime, the cases that need a service of their own: a
 * short reply timeout, a kill -9 and restart, no host fallback for a missing base image. The
 * rest of the suite is in sandboxes.test.ts and sandboxes-limits.test.ts.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { startServer } from '../helpers/server.ts';
import { backend } from '../helpers/backend.ts';
import { SPEC } from '../helpers/sandboxes.ts';

const runtime = backend('SVC_TEST_BWRAP', 'sandboxes on the local runtime');

if (runtime) {
  describe('sandboxes on the local runtime', () => {
    test('a command answers when it ends, however long past the reply timeout (up to its own timeout)', async () => {
      const own = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_REPLY_TIMEOUT: '2s' });
      try {
        await own.request('POST', '/v1/specs', { body: SPEC('slow-command'), headers: { 'content-type': 'application/x-yaml' } });
        const sb = (await own.request('POST', '/v1/sandboxes', { body: { spec_id: 'slow-command' } })).body;
        const slow = await own.request('POST', `/v1/sandboxes/${sb.id}/commands`, { body: { command: 'sleep 4; echo done', timeout: '20s' } });
        assert.equal(slow.status, 200, slow.text);
        assert.equal(slow.body.stdout, 'done\n');
        const killed = await own.request('POST', `/v1/sandboxes/${sb.id}/commands`, { body: { command: 'sleep 30', timeout: '3s' } });
        assert.equal(killed.status, 200, killed.text);
        assert.equal(killed.body.timed_out, true);
      } finally {
        await own.cleanup();
      }
    });

    test('after a kill -9 and restart, the sandboxes of the dead runner are not claimed ready', async () => {
      const own = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true' });
      try {
        await own.request('POST', '/v1/specs', { body: SPEC('orphan'), headers: { 'content-type': 'application/x-yaml' } });
        const sb = (await own.request('POST', '/v1/sandboxes', { body: { spec_id: 'orphan' } })).body;
        assert.equal(sb.state, 'ready');
        await own.kill9();
        await own.restart();
        assert.equal((await own.request('GET', `/v1/sandboxes/${sb.id}`)).status, 404);
        assert.deepEqual((await own.request('GET', '/v1/sandboxes')).body, []);
      } finally {
        await own.cleanup();
      }
    });

    test('without the host fallback, a base image missing from the store fails the boot', async () => {
      const strict = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'false' });
      try {
        await strict.request('POST', '/v1/specs', { body: SPEC('strict'), headers: { 'content-type': 'application/x-yaml' } });
        const res = await strict.request('POST', '/v1/sandboxes', { body: { spec_id: 'strict' } });
        assert.equal(res.status, 400);
        assert.match(res.body.message, /container_started: image could not be pulled: "debian:bookworm"/);
      } finally {
        await strict.cleanup();
      }
    });
  });
}
