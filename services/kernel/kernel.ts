/**
 * Builds the kernel from the configuration: the event log (embedded or Kafka), the schema
 * registry (built-in on the log, or external), the Avro serde, and the ClickHouse store (chDB or
 * a server), with migrations applied. Every service of the process shares it.
 */
import path from 'node:path';
import { mkdir } from 'node:fs/promises';
import { instanceIdFor, type Kernel } from './actor.ts';
import type { Config } from './config.ts';
import type { EventLog } from './log/event-log.ts';
import { EmbeddedLog } from './log/embedded/embedded-log.ts';
import { KafkaLog } from './log/kafka/kafka-log.ts';
import { NamespacedLog } from './log/namespaced-log.ts';
import type { Logger } from './logger.ts';
import { Metrics } from './metrics.ts';
import { BuiltInRegistry, HttpRegistry, type SchemaRegistry } from './schema/registry.ts';
import { EventSerde } from './schema/serde.ts';
import { ChdbStore } from './store/chdb-store.ts';
import { ClickHouseStore } from './store/clickhouse-store.ts';
import type { Store } from './store/store.ts';
import { loadCatalog } from './topics.ts';
import { Visibility } from './watermark.ts';

export interface OpenedKernel {
  kernel: Kernel;
  /** The built-in registry when this process owns it (no SVC_SCHEMA_REGISTRY_URL). */
  registry: BuiltInRegistry | null;
  close(): Promise<void>;
}

export async function openKernel(config: Config, logger: Logger): Promise<OpenedKernel> {
  await mkdir(config.dataDir, { recursive: true });
  const catalog = loadCatalog();
  const backend: EventLog =
    config.logBackend === 'embedded'
      ? new EmbeddedLog({ dir: path.join(config.dataDir, 'log'), fsync: config.logFsync, logger: logger.child({ component: 'log' }) })
      : new KafkaLog({ brokers: config.kafkaBrokers!, clientId: 'svc', logger: logger.child({ component: 'kafka' }) });
  const log = config.logNamespace ? new NamespacedLog(backend, config.logNamespace) : backend;
  await log.start(catalog);

  let builtIn: BuiltInRegistry | null = null;
  let registry: SchemaRegistry;
  if (config.schemaRegistryUrl) {
    // Credentials in the URL (http://user:secret@host/...) become Basic auth, which registries speak.
    const url = new URL(config.schemaRegistryUrl);
    const auth = url.password ? { username: decodeURIComponent(url.username), password: decodeURIComponent(url.password) } : undefined;
    url.username = '';
    url.password = '';
    registry = new HttpRegistry({ url: url.toString(), auth });
  } else {
    builtIn = new BuiltInRegistry(log);
    await builtIn.start();
    registry = builtIn;
  }
  const serde = new EventSerde(registry, catalog);
  await serde.init();

  const store: Store =
    config.store === 'chdb' ? new ChdbStore({ path: path.join(config.dataDir, 'chdb') }) : new ClickHouseStore({ url: config.clickhouseUrl! });
  const applied = await store.migrate();
  if (applied.length > 0) logger.info({ applied }, 'store migrations applied');
  await applyTraceRetention(store, config.traceRetention);

  const kernel: Kernel = {
    config,
    catalog,
    logger,
    log,
    serde,
    store,
    metrics: new Metrics(),
    visibility: new Visibility(catalog, log),
    instanceId: instanceIdFor(config),
  };
  return {
    kernel,
    registry: builtIn,
    close: async () => {
      await log.close();
      await store.close();
    },
  };
}

/**
 * SVC_TRACE_RETENTION as a TTL on trace_events (see 0002_trace_events.sql). Altered only when it
 * differs from the table's current TTL: a MODIFY TTL recomputes the TTL of every part.
 */
async function applyTraceRetention(store: Store, days: number | null): Promise<void> {
  const [table] = await store.query<{ ttl: string }>(
    "SELECT extract(engine_full, 'TTL toDateTime\\\\(Timestamp\\\\) \\\\+ toIntervalDay\\\\(\\\\d+\\\\)') AS ttl FROM system.tables WHERE database = currentDatabase() AND name = 'trace_events'",
  );
  const current = table?.ttl ?? '';
  if (days === null) {
    if (current !== '') await store.command('ALTER TABLE trace_events REMOVE TTL');
  } else if (current !== `TTL toDateTime(Timestamp) + toIntervalDay(${days})`) {
    await store.command(`ALTER TABLE trace_events MODIFY TTL toDateTime(Timestamp) + INTERVAL ${Math.trunc(days)} DAY`);
  }
}
