/**
 * Builds the kernel from the configuration: the event log (embedded or Kafka), the schema
 * registry (built-in on the log, or external), the Avro serde, and the ClickHouse store (chDB or
 * a server), with migrations applied. Every service of the process shares it. A process whose
 * services use no store (`svc run aggregator`, `svc run sandbox-runner`) opens none.
 */
import path from 'node:path';
import { mkdir } from 'node:fs/promises';
import { instanceIdFor, type Kernel } from './actor.ts';
import type { Config } from './config.ts';
import type { EventLog } from './log/event-log.ts';
import { EmbeddedLog } from './log/embedded/embedded-log.ts';
import { whenReachable } from './dependencies.ts';
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

export interface KernelOptions {
  /** False: the services of this process neither read nor write the store, so none is opened (no chDB, no server, no migrations). */
  store?: boolean;
}

export async function openKernel(config: Config, logger: Logger, options: KernelOptions = {}): Promise<OpenedKernel> {
  await mkdir(config.dataDir, { recursive: true });
  const catalog = loadCatalog();
  const backend: EventLog =
    config.logBackend === 'embedded'
      ? new EmbeddedLog({ dir: path.join(config.dataDir, 'log'), fsync: config.logFsync, logger: logger.child({ component: 'log' }) })
      : new KafkaLog({ brokers: config.kafkaBrokers!, clientId: 'svc', logger: logger.child({ component: 'kafka' }) });
  const log = config.logNamespace ? new NamespacedLog(backend, config.logNamespace) : backend;
  await whenReachable(config.logBackend === 'kafka' ? `Kafka at ${config.kafkaBrokers!.join(',')}` : 'the embedded log', logger, () => log.start(catalog));

  let builtIn: BuiltInRegistry | null = null;
  let registry: SchemaRegistry;
  let registryName = 'the built-in schema registry';
  if (config.schemaRegistryUrl) {
    const external = externalRegistry(config.schemaRegistryUrl, config.serviceKey);
    registryName = `the schema registry at ${external.base}`;
    registry = external;
  } else {
    builtIn = new BuiltInRegistry(log);
    await builtIn.start();
    registry = builtIn;
  }
  // Subjects follow the topics as the log names them (TopicNameStrategy under the namespace).
  const serde = new EventSerde(registry, catalog, undefined, config.logNamespace ?? '');
  await whenReachable(registryName, logger, () => serde.init()).catch((err) => {
    throw registryRefused(err);
  });

  const store: Store =
    options.store === false
      ? absentStore(config.store)
      : config.store === 'chdb'
        ? new ChdbStore({ path: path.join(config.dataDir, 'chdb') })
        : new ClickHouseStore({ url: config.clickhouseUrl! });
  if (options.store !== false) {
    const applied = await whenReachable(config.store === 'clickhouse' ? `ClickHouse at ${new URL(config.clickhouseUrl!).host}` : 'chDB', logger, async () => {
      const done = await store.migrate();
      await applyTraceRetention(store, config.traceRetention);
      return done;
    });
    if (applied.length > 0) logger.info({ applied }, 'store migrations applied');
  }

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

/** The store of a process that opened none: any use is a bug of the caller, said as such. */
function absentStore(kind: Store['kind']): Store {
  const refuse = async (): Promise<never> => {
    throw new Error('this process opened no store: none of its services was declared to use one (services/main.ts, STORE_SERVICES)');
  };
  return { kind, migrate: refuse, query: refuse, command: refuse, insert: refuse, ping: async () => false, close: async () => {} };
}

/**
 * SVC_SCHEMA_REGISTRY_URL as a client. Credentials in the URL (http://user:secret@host/...)
 * become Basic auth, which registries speak; without them the service key is sent, which the
 * api's built-in registry accepts from the other processes.
 */
function externalRegistry(registryUrl: string, serviceKey: string | null): HttpRegistry {
  const url = new URL(registryUrl);
  const auth = url.password
    ? { username: decodeURIComponent(url.username), password: decodeURIComponent(url.password) }
    : serviceKey !== null
      ? { username: 'svc', password: serviceKey }
      : undefined;
  url.username = '';
  url.password = '';
  return new HttpRegistry({ url: url.toString(), auth });
}

/** A registry that refuses this process's credentials: say which settings give them. */
function registryRefused(err: unknown): unknown {
  const code = (err as { code?: unknown }).code;
  if (code !== 'unauthorized' && code !== 'forbidden') return err;
  return new Error(
    `${(err as Error).message}\n  the schema registry refused this process: set SVC_SERVICE_KEY to the api process's value (its built-in registry accepts it), or give credentials in SVC_SCHEMA_REGISTRY_URL`,
    { cause: err },
  );
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
