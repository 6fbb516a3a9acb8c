/**
 * The client SDK where agents use it: inside a sandbox, configured only by the SVC_* variables
 * the sandbox gets. The SDK is bundled with esbuild into one file, written into the workspace
 * and run by node (the host's, mounted read-only in the sandbox); its traces travel over the
 * sandbox's bridge to the service and are read back through the API.
 */
import assert from 'node:assert/strict';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { build } from 'esbuild';
import { backend } from '../helpers/backend.ts';
import { createTenantKey, REPO, startServer, type TestServer } from '../helpers/server.ts';

const AGENT = `
import { createClient, getTracer, traced } from ${JSON.stringify(path.join(REPO, 'packages/sdk/src/index.ts'))};
const answer = await traced('plan', async () => {
  const found = await traced('search', async () => ['a.txt', 'b.txt'], { event_type: 'tool_call', input: { query: 'txt' } });
  getTracer().emit({ event_type: 'llm_call', tool: 'chat', phase: 'complete', cost: { model: 'gpt-4o', input_tokens: 10, output_tokens: 5, estimated_usd: 0.001 } });
  return found.length;
});
const self = await createClient().sandboxes.self();
await getTracer().shutdown();
console.log(JSON.stringify({ answer, state: self.state, dropped: getTracer().dropped }));
`;

const runtime = backend('SVC_TEST_BWRAP', 'the SDK inside a sandbox');

if (runtime) {
  describe('the client SDK inside a sandbox', () => {
    let server: TestServer;
    let key: string;
    before(async () => {
      server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true' });
      key = (await createTenantKey(server, 'acme')).key;
    });
    after(async () => server?.cleanup());

    test('from SVC_BASE_URL, SVC_API_KEY and SVC_SANDBOX_ID alone, its spans and events reach the sandbox trace', async () => {
      const bundled = await build({
        stdin: { contents: AGENT, loader: 'ts', resolveDir: REPO },
        bundle: true,
        platform: 'node',
        format: 'esm',
        target: 'node20',
        write: false,
      });
      const spec =
        'version: 1\nid: sdk-agent\nbase: debian:bookworm\ntask: {prompt: trace}\ninvariants: {ok: {check: {type: command_exit, command: "true"}}}\n';
      assert.equal((await server.request('POST', '/v1/specs', { key, body: spec, headers: { 'content-type': 'application/x-yaml' } })).status, 201);
      const sb = (await server.request('POST', '/v1/sandboxes', { key, body: { spec_id: 'sdk-agent' } })).body;
      const written = await server.request('POST', `/v1/sandboxes/${sb.id}/files`, { key, body: { path: 'agent.mjs', content: bundled.outputFiles[0].text } });
      assert.equal(written.status, 201, written.text);

      const run = await server.request('POST', `/v1/sandboxes/${sb.id}/commands`, { key, body: { command: 'node agent.mjs', timeout: '30s' } });
      assert.equal(run.body.exit_code, 0, run.text);
      assert.deepEqual(JSON.parse(run.body.stdout), { answer: 2, state: 'running', dropped: 0 });

      const { events } = (await server.request('GET', `/v1/sandboxes/${sb.id}/trace`, { key })).body;
      const seen = events.map((e: any) => `${e.tool}:${e.phase}`).sort();
      assert.deepEqual(seen, ['chat:complete', 'plan:end', 'plan:start', 'search:end', 'search:start']);
      const plan = events.find((e: any) => e.tool === 'plan' && e.phase === 'start');
      const search = events.find((e: any) => e.tool === 'search' && e.phase === 'end');
      const chat = events.find((e: any) => e.tool === 'chat');
      assert.equal(search.parent_span_id, plan.span_id, 'the span tree survives the trip');
      assert.equal(chat.parent_span_id, plan.span_id);
      assert.equal(events.find((e: any) => e.tool === 'search' && e.phase === 'start').input, '{"query":"txt"}');
      assert.equal(search.output, '["a.txt","b.txt"]');
      assert.ok(events.every((e: any) => e.sandbox_id === sb.id && e.tenant === 'acme'));
      await server.request('DELETE', `/v1/sandboxes/${sb.id}`, { key });
    });
  });
}
