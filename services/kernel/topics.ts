/**
 * The topic catalog (topics/catalog.yaml): the single source of topics for both log backends
 * and for the schema subjects (`<topic>-value`, see kernel/schema/serde.ts). Code names topics
 * through TOPICS, never through string literals, and `checkTopicConstants` proves at start that
 * every constant is in the catalog.
 */
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import type { CleanupPolicy, TopicSpec } from './log/event-log.ts';
import { parseDuration } from './duration.ts';
import { isObject } from './is-object.ts';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const DEFAULT_TOPICS_DIR = join(REPO_ROOT, 'topics');

/** Names of the topics the code uses. Each must be an entry of topics/catalog.yaml. */
export const TOPICS = {
  traces: 'svc.traces',
  tenants: 'svc.tenants',
  apiKeys: 'svc.api-keys',
  idempotency: 'svc.idempotency',
  deadLetters: 'svc.dead-letters',
  specs: 'svc.specs',
  agents: 'svc.agents',
  bundles: 'svc.bundles',
  experiments: 'svc.experiments',
  experimentCommands: 'svc.experiment-commands',
  experimentScenarios: 'svc.experiment-scenarios',
  datasets: 'svc.datasets',
  datasetRecords: 'svc.dataset-records',
  runRequests: 'svc.run-requests',
  runEvents: 'svc.run-events',
  runScores: 'svc.run-scores',
  scoreRules: 'svc.score-rules',
  scoreRequests: 'svc.score-requests',
  scores: 'svc.scores',
  alerts: 'svc.alerts',
  alertFirings: 'svc.alert-firings',
  alertEvaluations: 'svc.alert-evaluations',
  alertReplies: 'svc.alert-replies',
  tenantSecrets: 'svc.tenant-secrets',
  sandboxRequests: 'svc.sandbox-requests',
  sandboxReplies: 'svc.sandbox-replies',
  sandboxes: 'svc.sandboxes',
  sandboxEvents: 'svc.sandbox-events',
  terminalInput: 'svc.terminal-input',
  terminalOutput: 'svc.terminal-output',
  runners: 'svc.runners',
  audit: 'svc.audit',
  /** The built-in schema registry's own state (raw JSON values, not Avro). */
  schemas: '_schemas',
} as const;

/** `7d`, `24h`, `30m`, `45s`, `500ms`, `2w` to milliseconds; `forever` to null. */
export function parseRetention(value: string): number | null {
  if (value.trim() === 'forever') return null;
  let ms: number;
  try {
    ms = parseDuration(value, 'whole');
  } catch {
    throw new Error(`"${value}" is not a duration (use a whole number with s, m, h, d or w, e.g. 7d, or "forever")`);
  }
  if (ms <= 0) throw new Error(`"${value}" must be longer than zero`);
  return ms;
}

const TOPIC_NAME = /^[A-Za-z0-9._-]{1,249}$/;
const SCHEMA_NAME = /^[A-Za-z0-9._-]+$/;

/** Validates the parsed catalog document; every error names the entry and the field. */
function parseCatalog(doc: unknown, source = 'catalog'): TopicSpec[] {
  if (!isObject(doc) || !Array.isArray(doc.topics)) {
    throw new Error(`${source}: expected a top-level "topics" list`);
  }
  const seen = new Set<string>();
  return doc.topics.map((entry: unknown, i: number): TopicSpec => {
    const where = (field: string) => `${source}: topics[${i}]${isObject(entry) && typeof entry.name === 'string' ? ` (${entry.name})` : ''}.${field}`;
    if (!isObject(entry)) throw new Error(`${source}: topics[${i}] must be a mapping`);
    const { name, partitions, key, value_schema: valueSchema, cleanup_policy: cleanupPolicy, retention, table, flush_interval: flushInterval } = entry;
    if (typeof name !== 'string' || !TOPIC_NAME.test(name)) {
      throw new Error(`${where('name')}: must be a topic name of letters, digits, ".", "_" or "-" (got ${JSON.stringify(name)})`);
    }
    if (seen.has(name)) throw new Error(`${where('name')}: topic "${name}" is listed twice`);
    seen.add(name);
    if (typeof partitions !== 'number' || !Number.isInteger(partitions) || partitions < 1) {
      throw new Error(`${where('partitions')}: must be a whole number >= 1 (got ${JSON.stringify(partitions)})`);
    }
    if (typeof key !== 'string' || key.trim() === '') {
      throw new Error(`${where('key')}: must describe the record key (got ${JSON.stringify(key)})`);
    }
    if (valueSchema !== null && (typeof valueSchema !== 'string' || !SCHEMA_NAME.test(valueSchema))) {
      throw new Error(`${where('value_schema')}: must name a file in schemas/ without .avsc, or be null (got ${JSON.stringify(valueSchema)})`);
    }
    if (cleanupPolicy !== 'delete' && cleanupPolicy !== 'compact') {
      throw new Error(`${where('cleanup_policy')}: must be "delete" or "compact" (got ${JSON.stringify(cleanupPolicy)})`);
    }
    if (typeof retention !== 'string') {
      throw new Error(`${where('retention')}: must be a duration such as 7d or 24h, or "forever" (got ${JSON.stringify(retention)})`);
    }
    let retentionMs: number | null;
    try {
      retentionMs = parseRetention(retention);
    } catch (err) {
      throw new Error(`${where('retention')}: ${(err as Error).message}`);
    }
    if (table !== undefined && table !== null && (typeof table !== 'string' || !/^[a-z_][a-z0-9_]*$/.test(table))) {
      throw new Error(`${where('table')}: must be a ClickHouse table name of a-z, 0-9 and _ (got ${JSON.stringify(table)})`);
    }
    let flushIntervalMs: number | null = null;
    if (flushInterval !== undefined) {
      if (typeof table !== 'string') throw new Error(`${where('flush_interval')}: only a topic with a table has one`);
      let ms: number | null = null;
      try {
        if (typeof flushInterval === 'string') ms = parseRetention(flushInterval);
      } catch {
        // named below
      }
      if (ms === null) throw new Error(`${where('flush_interval')}: must be a duration such as 250ms (got ${JSON.stringify(flushInterval)})`);
      flushIntervalMs = ms;
    }
    return {
      name,
      partitions,
      key,
      valueSchema: valueSchema as string | null,
      cleanupPolicy: cleanupPolicy as CleanupPolicy,
      retentionMs,
      table: (table as string | undefined) ?? null,
      ...(flushIntervalMs === null ? {} : { flushIntervalMs }),
    };
  });
}

/**
 * Reads and validates `<dir>/catalog.yaml`. Unless `requireCodeTopics` is false (tests with a
 * catalog of their own), it also checks that every topic in TOPICS is in it.
 */
export function loadCatalog(dir: string = DEFAULT_TOPICS_DIR, options: { requireCodeTopics?: boolean } = {}): TopicSpec[] {
  const file = join(dir, 'catalog.yaml');
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new Error(`topic catalog ${file} cannot be read: ${(err as Error).message}`, { cause: err });
  }
  let doc: unknown;
  try {
    doc = parse(text);
  } catch (err) {
    throw new Error(`topic catalog ${file} is not valid YAML: ${(err as Error).message}`, { cause: err });
  }
  const catalog = parseCatalog(doc, file);
  if (options.requireCodeTopics !== false) checkTopicConstants(catalog);
  return catalog;
}

/** Throws when a name in TOPICS has no entry in the catalog. */
export function checkTopicConstants(catalog: TopicSpec[]): void {
  const names = new Set(catalog.map((t) => t.name));
  const missing = Object.entries(TOPICS).filter(([, name]) => !names.has(name));
  if (missing.length > 0) {
    throw new Error(`topic catalog lacks topics the code uses: ${missing.map(([k, n]) => `${n} (TOPICS.${k})`).join(', ')}`);
  }
}

/** The consumer group of the sink that materialises a table; its commits mean "in the store". */
export function sinkGroupId(table: string): string {
  return `sink.${table}`;
}

/** The catalog entry of a topic, or a clear error. */
export function topicSpec(catalog: TopicSpec[], name: string): TopicSpec {
  const spec = catalog.find((t) => t.name === name);
  if (!spec) throw new Error(`topic ${name} is not in the topic catalog`);
  return spec;
}
