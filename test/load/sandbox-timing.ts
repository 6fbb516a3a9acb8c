/** What the sandbox benches share: storing their specs, timed creates, and creates interleaved between specs. */
import type { TestServer } from '../helpers/server.ts';

export interface Timed {
  create(spec: string): Promise<{ id: string; ms: number }>;
  destroy(id: string): Promise<unknown>;
}

/** Stores `specs` (YAML) on `server`, and times sandbox creates from them. */
export async function timedSandboxes(server: TestServer, specs: string[]): Promise<Timed> {
  for (const yaml of specs) await server.request('POST', '/v1/specs', { body: yaml, headers: { 'content-type': 'application/x-yaml' } });
  return {
    async create(spec) {
      const started = performance.now();
      const res = await server.request('POST', '/v1/sandboxes', { body: { spec_id: spec } });
      if (res.status !== 201) throw new Error(`create: ${res.status} ${res.text}`);
      return { id: res.body.id as string, ms: performance.now() - started };
    },
    destroy: (id) => server.request('DELETE', `/v1/sandboxes/${id}`),
  };
}

/**
 * Create-to-ready times of each spec, `rounds` each after `warmup` untimed, interleaved so a slow
 * spell of the machine weighs on all alike.
 */
export async function interleavedCreates<S extends string>(timed: Timed, specs: readonly S[], warmup: number, rounds: number): Promise<Record<S, number[]>> {
  for (let i = 0; i < warmup; i++) for (const spec of specs) await timed.destroy((await timed.create(spec)).id);
  const times = Object.fromEntries(specs.map((s) => [s, [] as number[]])) as Record<S, number[]>;
  for (let i = 0; i < rounds; i++) {
    for (const spec of specs) {
      const { id, ms } = await timed.create(spec);
      times[spec].push(ms);
      await timed.destroy(id);
    }
  }
  return times;
}
