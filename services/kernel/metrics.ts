import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

/**
 * The service's own figures, served at GET /metrics in Prometheus format. Every metric is
 * declared here, so the list in docs/operations.md has one source.
 */
export class Metrics {
  readonly registry = new Registry();

  readonly httpRequests = new Counter({
    name: 'svc_http_requests_total',
    help: 'HTTP requests by route, method and status.',
    labelNames: ['route', 'method', 'status'] as const,
    registers: [this.registry],
  });
  readonly httpDuration = new Histogram({
    name: 'svc_http_request_duration_seconds',
    help: 'HTTP request latency by route.',
    labelNames: ['route', 'method'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10],
    registers: [this.registry],
  });
  readonly ingestedEvents = new Counter({
    name: 'svc_ingested_events_total',
    help: 'Trace events accepted by the ingest endpoints.',
    labelNames: ['endpoint'] as const,
    registers: [this.registry],
  });
  readonly ingestStageSeconds = new Histogram({
    name: 'svc_ingest_stage_duration_seconds',
    help: 'Time of one accepted ingest request in each stage: decode (waiting for an ingest worker, then its parse, validation and encoding), append (until the log holds it durably), visible (until the sink made it queryable; not with respond-async).',
    labelNames: ['stage'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10],
    registers: [this.registry],
  });
  readonly appendedRecords = new Counter({
    name: 'svc_log_appended_records_total',
    help: 'Records appended to the event log, by topic.',
    labelNames: ['topic'] as const,
    registers: [this.registry],
  });
  readonly consumerLag = new Gauge({
    name: 'svc_consumer_lag_records',
    help: 'Records not yet committed by a consumer group, by group and topic.',
    labelNames: ['group', 'topic'] as const,
    registers: [this.registry],
  });
  readonly handlerFailures = new Counter({
    name: 'svc_handler_failures_total',
    help: 'Failed handler attempts, by consumer group.',
    labelNames: ['group'] as const,
    registers: [this.registry],
  });
  readonly deadLettered = new Counter({
    name: 'svc_dead_lettered_total',
    help: 'Records sent to the dead-letter topic, by consumer group and source topic.',
    labelNames: ['group', 'topic'] as const,
    registers: [this.registry],
  });
  readonly sinkBatchItems = new Histogram({
    name: 'svc_sink_batch_items',
    help: 'Items per ClickHouse insert of the sink, by table: rows, or log records where the engine makes the rows from them (trace_events on chDB).',
    labelNames: ['table'] as const,
    buckets: [1, 10, 100, 1000, 5000, 10000, 20000, 50000, 100000],
    registers: [this.registry],
  });
  readonly sinkInsertSeconds = new Histogram({
    name: 'svc_sink_insert_duration_seconds',
    help: 'Latency of one ClickHouse insert of the sink, by table.',
    labelNames: ['table'] as const,
    buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
    registers: [this.registry],
  });
  readonly sandboxes = new Gauge({
    name: 'svc_sandboxes',
    help: 'Sandboxes by state.',
    labelNames: ['state'] as const,
    registers: [this.registry],
  });
  /** Counts of warm sandboxes waiting (a runner's pool each), read at each scrape. */
  private readonly warmSources = new Set<() => number>();
  readonly warmSandboxes: Gauge = new Gauge({
    name: 'svc_sandbox_pool_warm',
    help: 'Warm sandboxes waiting to be handed out (made ahead, never run) in this process.',
    registers: [this.registry],
    collect: (): void => this.warmSandboxes.set([...this.warmSources].reduce((n, count) => n + count(), 0)),
  });

  /** Committing consumer groups of this process, whose lag is measured at each scrape. */
  private readonly lagSources = new Set<string>();

  /** Adds a pool's count of waiting warm sandboxes to svc_sandbox_pool_warm; returns what takes it away again. */
  countWarm(count: () => number): () => void {
    this.warmSources.add(count);
    return () => this.warmSources.delete(count);
  }

  trackLag(group: string, topics: string[]): void {
    for (const topic of topics) this.lagSources.add(`${group}\u0000${topic}`);
  }

  /** Refreshes the lag gauges from the log (end offsets minus committed offsets), then renders. */
  async render(log: { endOffsets(topic: string): Promise<number[]>; committedOffsets(group: string, topic: string): Promise<number[]> }): Promise<string> {
    await Promise.all(
      [...this.lagSources].map(async (source) => {
        const [group, topic] = source.split('\u0000');
        const [ends, committed] = await Promise.all([log.endOffsets(topic), log.committedOffsets(group, topic)]);
        const lag = ends.reduce((sum, end, p) => sum + Math.max(0, end - Math.max(0, committed[p] ?? 0)), 0);
        this.consumerLag.set({ group, topic }, lag);
      }),
    );
    return this.registry.metrics();
  }

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: 'svc_process_' });
    for (const state of ['creating', 'ready', 'running', 'stopped', 'error']) this.sandboxes.set({ state }, 0);
  }
}
