/**
 * What the file-audit suites (e2e and red team) share: commands run in a sandbox made for them,
 * and the file records it leaves once destroyed (the reconciliation's included).
 */
import assert from 'node:assert/strict';
import { SPEC, storeSpec } from './sandboxes.ts';
import type { TestServer } from './server.ts';

/** A file record as [type, path, found_by?] (found_by only when the reconciliation found it). */
export type FileRecord = [type: string, path: string, ...foundBy: string[]];

/**
 * Stores `SPEC(name, specExtra)` as `key`'s tenant, runs `commands` in a new sandbox of it (each
 * must exit 0), destroys it and returns its records of `types`. Asserts it warned of nothing but
 * what `tolerated` matches (a warning is a degraded capture).
 */
export async function sandboxFileRecords(
  server: TestServer,
  key: string,
  name: string,
  specExtra: string,
  commands: string[],
  options: { types: string[]; tolerated: RegExp },
): Promise<FileRecord[]> {
  const req = (method: string, p: string, body?: unknown) => server.request(method, p, { key, body });
  await storeSpec(server, key, SPEC(name, specExtra));
  const created = await req('POST', '/v1/sandboxes', { spec_id: name });
  assert.equal(created.status, 201, created.text);
  const id = created.body.id as string;
  for (const command of commands) {
    const res = await req('POST', `/v1/sandboxes/${id}/commands`, { command });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.exit_code, 0, res.text);
  }
  assert.equal((await req('DELETE', `/v1/sandboxes/${id}`)).status, 200);
  const audit = await req('GET', `/v1/sandboxes/${id}/audit?type=${[...options.types, 'warning'].join(',')}&limit=1000`);
  assert.equal(audit.status, 200, audit.text);
  const warnings = audit.body.items.filter((i: any) => i.type === 'warning' && !options.tolerated.test(i.details.message));
  assert.deepEqual(warnings, [], `no capture was degraded: ${JSON.stringify(warnings)}`);
  return audit.body.items
    .filter((i: any) => i.type !== 'warning')
    .map((i: any) => [i.type, i.details.path, ...(i.details.found_by ? [i.details.found_by] : [])]);
}
