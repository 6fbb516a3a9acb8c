import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EmbeddedLog } from '../../services/kernel/log/embedded/embedded-log.ts';
import type { EventLog } from '../../services/kernel/log/event-log.ts';
import { eventLogContract } from './event-log.contract.ts';

const quiet = { info() {}, warn() {}, error() {} };

for (const fsync of ['always', 'never'] as const) {
  eventLogContract(
    `EventLog contract: embedded (fsync ${fsync})`,
    async () => {
      const dir = await mkdtemp(join(tmpdir(), 'event-log-contract-'));
      const made: EmbeddedLog[] = [];
      const make = (): EmbeddedLog => {
        const log = new EmbeddedLog({ dir, fsync, logger: quiet, segmentBytes: 4096, redeliveryBackoffMs: 20 });
        made.push(log);
        return log;
      };
      return {
        log: make(),
        reopen: async () => make(),
        cleanup: async () => {
          for (const log of made) await log.close();
          await rm(dir, { recursive: true, force: true });
        },
      };
    },
    {
      compact: (log: EventLog, topic: string) => (log as EmbeddedLog).compact(topic, { rollActive: true }),
      waitMs: 10_000,
    },
  );
}
