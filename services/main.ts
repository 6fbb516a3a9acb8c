/**
 * Process entry. Embedded (default): every service in this one process. `svc run <service>`:
 * one of them (the distributed deployment, on Kafka). SIGTERM/SIGINT stop gracefully: the API
 * stops accepting and finishes in-flight requests, consumers finish and commit their batch, the
 * sink flushes, then the log and the store close.
 */
import { parseArgs } from 'node:util';
import v8 from 'node:v8';
import type { Kernel, Service } from './kernel/actor.ts';
import { loadConfig, type Config } from './kernel/config.ts';
import { openKernel } from './kernel/kernel.ts';
import { createLogger } from './kernel/logger.ts';
import { ApiService } from './api/service.ts';
import { SinkService } from './sink/service.ts';
import { AggregatorService } from './aggregator/service.ts';
import { SandboxRunnerService } from './sandbox-runner/service.ts';
import { ScorerService } from './scorer/service.ts';
import { AlerterService } from './alerter/service.ts';

const SERVICE_NAMES = ['api', 'sink', 'sandbox-runner', 'aggregator', 'scorer', 'alerter'] as const;
export type ServiceName = (typeof SERVICE_NAMES)[number];
/** The services that read the store the sink writes (the aggregator, the alerter and the runners read none). */
const STORE_READERS: readonly ServiceName[] = ['api', 'scorer'];
/** The services that use the store at all: a process of none of them opens no store. */
const STORE_SERVICES: readonly ServiceName[] = [...STORE_READERS, 'sink'];

export interface Running {
  config: Config;
  kernel: Kernel;
  api: ApiService | null;
  stop(): Promise<void>;
}

/** Starts the named services (all of them by default) and returns a handle to stop them. */
export async function startServices(config: Config, names: readonly ServiceName[] = SERVICE_NAMES): Promise<Running> {
  const logger = createLogger(config.logLevel);
  const usesStore = names.some((n) => STORE_SERVICES.includes(n));
  const opened = await openKernel(config, logger, { store: usesStore });
  const services: Service[] = [];
  let api: ApiService | null = null;
  // The sink starts first: the API's writes await its watermarks.
  if (names.includes('sink')) services.push(new SinkService());
  if (names.includes('sandbox-runner')) services.push(new SandboxRunnerService());
  if (names.includes('aggregator')) services.push(new AggregatorService());
  if (names.includes('scorer')) services.push(new ScorerService());
  if (names.includes('alerter')) services.push(new AlerterService());
  if (names.includes('api')) services.push((api = new ApiService({ registry: opened.registry })));
  const started: Service[] = [];
  try {
    for (const service of services) {
      await service.start(opened.kernel);
      started.push(service);
    }
  } catch (err) {
    for (const service of started.reverse()) await service.stop().catch(() => {});
    await opened.close().catch(() => {});
    throw err;
  }
  logger.info({ services: names, log: config.logBackend, store: usesStore ? config.store : 'none', data_dir: config.dataDir }, 'started');
  let stopping: Promise<void> | null = null;
  return {
    config,
    kernel: opened.kernel,
    api,
    stop: () =>
      (stopping ??= (async () => {
        for (const service of [...started].reverse()) {
          logger.info({ service: service.name }, 'stopping');
          await service.stop();
        }
        await opened.close();
        logger.info('stopped');
      })()),
  };
}

/**
 * What a process running some of the services needs beyond loadConfig's checks (the settings
 * of each service are tabled in docs/operations.md). Each problem names its variable.
 */
export function checkSplitSettings(config: Config, names: readonly ServiceName[]): void {
  const problems: string[] = [];
  if (config.logBackend === 'embedded') {
    problems.push('SVC_LOG_BACKEND: svc run <service...> splits the services over processes and needs kafka: the embedded log belongs to one process');
  }
  // One registry hands out schema ids: the api's built-in one, or an external one.
  if (!names.includes('api') && !config.schemaRegistryUrl) {
    problems.push(
      "SVC_SCHEMA_REGISTRY_URL: required in a process without the api: point it at the api's built-in registry (http://<api>/schema-registry, with SVC_SERVICE_KEY) or at an external registry",
    );
  }
  // The api seals what it sends the runners and opens their replies, with one key on both sides.
  if (names.includes('api') !== names.includes('sandbox-runner') && !config.secretsKey) {
    problems.push(
      'SVC_SECRETS_KEY: required when the api and the sandbox runners run in different processes: both seal and open what they send each other with it (set the same key in both)',
    );
  }
  // The api and the scorer read what the sink stored: chDB is the store of one process, so they
  // read it only beside the sink; apart from it, they need the ClickHouse server all share.
  const readers = STORE_READERS.filter((n) => names.includes(n));
  if (readers.length > 0 && !names.includes('sink') && config.store !== 'clickhouse') {
    problems.push(
      `SVC_STORE: ${readers.join(' and ')} read${readers.length === 1 ? 's' : ''} the store the sink writes: set SVC_STORE=clickhouse (and SVC_CLICKHOUSE_URL) to the server the sink writes, or run ${readers.join(' and ')} in the sink's process (svc run api sink scorer); chDB here would be this process's own empty store`,
    );
  }
  if (problems.length > 0) throw new Error(`Bad configuration for svc run ${names.join(' ')}:\n  ${problems.join('\n  ')}`);
}

/** How long a graceful stop (SIGTERM, SIGINT) may take before the process exits anyway. */
const SHUTDOWN_DEADLINE_MS = 30_000;

/** `node services/main.ts [--api-key KEY] [run <service...>]`. */
/**
 * V8 sizes the next full collection's trigger from the heap that survived the last one, times a
 * factor it picks (1.1-4). Under ingest the api's heap is steady (~45 MB live) while request
 * bodies and records churn ArrayBuffers, which count toward that trigger: V8 kept the factor
 * near 1.1 and marked the whole heap every ~200 ms, mostly on its platform threads, which share
 * the two cores with everything else. A fixed factor of 2 cut those collections from 33 to 10
 * per 300,000 events (docs/performance.md). V8's flags are per process, so the ingest workers get
 * it too; an operator's own --heap-growing-percent wins.
 */
function growHeapFaster(): void {
  if (!process.execArgv.some((arg) => /^--heap[-_]growing[-_]percent/.test(arg))) v8.setFlagsFromString('--heap-growing-percent=100');
}

export async function main(argv: string[]): Promise<void> {
  growHeapFaster();
  const { values, positionals } = parseArgs({ args: argv, options: { 'api-key': { type: 'string' } }, allowPositionals: true, strict: true });
  let names: readonly ServiceName[] = SERVICE_NAMES;
  if (positionals[0] === 'run') {
    const requested = positionals.slice(1);
    const unknown = requested.filter((n) => !SERVICE_NAMES.includes(n as ServiceName));
    if (requested.length === 0 || unknown.length > 0) {
      throw new Error(`svc run: unknown service "${unknown.join(' ')}"; give one or more of ${SERVICE_NAMES.join(', ')}`);
    }
    names = requested as ServiceName[];
  } else if (positionals.length > 0) {
    throw new Error(`unknown command "${positionals.join(' ')}"`);
  }
  const config = loadConfig(process.env, values['api-key'] ? { SVC_API_KEY: values['api-key'] } : {}, { requireAdminKey: names.includes('api') });
  if (names.length < SERVICE_NAMES.length) checkSplitSettings(config, names);
  const running = await startServices(config, names);
  const shutdown = (signal: string) => {
    process.stderr.write(`received ${signal}, stopping\n`);
    // A stop that hangs must not keep the process (and its port, its data dir) forever: the
    // last 'stopping' log line names the service that did not finish.
    setTimeout(() => {
      process.stderr.write(`shutdown did not finish within ${SHUTDOWN_DEADLINE_MS / 1000} s; exiting\n`);
      process.exit(1);
    }, SHUTDOWN_DEADLINE_MS).unref();
    running.stop().then(
      () => process.exit(0),
      (err) => {
        process.stderr.write(`shutdown failed: ${(err as Error).stack}\n`);
        process.exit(1);
      },
    );
  };
  process.once('SIGTERM', () => shutdown('SIGTERM'));
  process.once('SIGINT', () => shutdown('SIGINT'));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main(process.argv.slice(2)).catch((err) => {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  });
}
