/**
 * Schema registries. Every event value is Avro in the Confluent wire format, so a value names
 * its writer schema by a registry id. Two implementations of the one seam:
 *
 * - BuiltInRegistry: a Confluent-compatible registry whose state lives on the `_schemas` topic
 *   of the EventLog (compacted, key `<subject>/<version>`, value the registry's own JSON record,
 *   not Avro), as Confluent's own keeps its state in Kafka. The api process serves it over HTTP
 *   (services/api/routes/schema-registry.ts), so Kafka tools and other processes can use it.
 * - HttpRegistry: any external Confluent-compatible registry (Confluent, Redpanda, Apicurio's
 *   ccompat API) over its REST API.
 *
 * Ids are global: one schema (by canonical form) has one id in every subject that holds it.
 */
import avro from 'avsc';
import { AppError, type ErrorCode } from '../errors.ts';
import type { EventLog, LogRecord } from '../log/event-log.ts';
import { TOPICS } from '../topics.ts';

/** What the event serde needs from a registry. */
export interface SchemaRegistry {
  /** Registers `schema` (Avro schema JSON) under `subject`; resolves to its global id. */
  register(subject: string, schema: string): Promise<number>;
  /** The schema JSON of a global id. */
  getSchema(id: number): Promise<string>;
}

export const COMPATIBILITY_LEVELS = ['NONE', 'BACKWARD', 'BACKWARD_TRANSITIVE', 'FORWARD', 'FORWARD_TRANSITIVE', 'FULL', 'FULL_TRANSITIVE'] as const;
export type CompatibilityLevel = (typeof COMPATIBILITY_LEVELS)[number];

const DEFAULT_COMPATIBILITY: CompatibilityLevel = 'BACKWARD';

/** Confluent's error codes, which its clients and tools read from `{error_code, message}`. */
export const REGISTRY_ERRORS = {
  subjectNotFound: 40401,
  versionNotFound: 40402,
  schemaNotFound: 40403,
  subjectCompatibilityNotConfigured: 40408,
  incompatible: 409,
  invalidSchema: 42201,
  invalidVersion: 42202,
  invalidCompatibilityLevel: 42203,
  storeError: 50001,
} as const;

/**
 * An error of the registry: an AppError (code and HTTP status of the service's catalog) that also
 * carries Confluent's `error_code`, which the registry's HTTP API renders.
 */
export class SchemaRegistryError extends AppError {
  readonly errorCode: number;
  constructor(errorCode: number, code: ErrorCode, message: string, options: { cause?: unknown } = {}) {
    super(code, message, options);
    this.name = 'SchemaRegistryError';
    this.errorCode = errorCode;
  }
}

export interface SubjectVersion {
  subject: string;
  version: number;
  id: number;
  /** The schema JSON as registered (compact). */
  schema: string;
}

export interface CompatibilityResult {
  isCompatible: boolean;
  /** Why not, one line per failed check. */
  messages: string[];
}

/** A parsed Avro schema with its canonical form (the key of schema identity). */
interface ParsedSchema {
  /** Compact JSON of the schema as given. */
  text: string;
  /**
   * Identity of the schema: avsc's export with attributes (docs, defaults, order, aliases),
   * so key order and whitespace do not matter while every other difference does (as in
   * Confluent, a changed doc or default is a new version).
   */
  canonical: string;
  type: avro.Type;
}

/** Parses Avro schema JSON; a 42201 error when it is not valid JSON or not a valid schema. */
function parseAvroSchema(schema: string): ParsedSchema {
  if (typeof schema !== 'string' || schema.trim() === '') {
    throw new SchemaRegistryError(REGISTRY_ERRORS.invalidSchema, 'bad_request', 'Invalid schema: expected the schema as a JSON string');
  }
  let json: unknown;
  try {
    json = JSON.parse(schema);
  } catch (err) {
    throw new SchemaRegistryError(REGISTRY_ERRORS.invalidSchema, 'bad_request', `Invalid schema: not JSON (${(err as Error).message})`);
  }
  let type: avro.Type;
  try {
    type = avro.Type.forSchema(json as avro.Schema);
  } catch (err) {
    throw new SchemaRegistryError(REGISTRY_ERRORS.invalidSchema, 'bad_request', `Invalid schema: ${(err as Error).message}`);
  }
  return { text: JSON.stringify(json), canonical: JSON.stringify(type.schema({ exportAttrs: true })), type };
}

/** True when data written with `writer` can be read with `reader` (Avro schema resolution). */
function canRead(reader: avro.Type, writer: avro.Type): string | null {
  try {
    reader.createResolver(writer);
    return null;
  } catch (err) {
    return (err as Error).message;
  }
}

/**
 * Checks `candidate` against `previous` (oldest first) by the level's rules: BACKWARD means the
 * new schema reads data of the previous one, FORWARD that the previous one reads data of the
 * new one, FULL both; the transitive levels check every previous version, the others the latest.
 */
function checkAgainst(candidate: avro.Type, previous: Array<{ version: number; type: avro.Type }>, level: CompatibilityLevel): CompatibilityResult {
  if (level === 'NONE' || previous.length === 0) return { isCompatible: true, messages: [] };
  const targets = level.endsWith('_TRANSITIVE') ? previous : previous.slice(-1);
  const backward = level.startsWith('BACKWARD') || level.startsWith('FULL');
  const forward = level.startsWith('FORWARD') || level.startsWith('FULL');
  const messages: string[] = [];
  for (const { version, type } of targets) {
    if (backward) {
      const problem = canRead(candidate, type);
      if (problem) messages.push(`new schema cannot read data written with version ${version} (${level}): ${problem}`);
    }
    if (forward) {
      const problem = canRead(type, candidate);
      if (problem) messages.push(`version ${version} cannot read data written with the new schema (${level}): ${problem}`);
    }
  }
  return { isCompatible: messages.length === 0, messages };
}

export function isCompatibilityLevel(value: unknown): value is CompatibilityLevel {
  return typeof value === 'string' && (COMPATIBILITY_LEVELS as readonly string[]).includes(value);
}

// ---------------------------------------------------------------------------------------------
// The built-in registry
// ---------------------------------------------------------------------------------------------

/** A schema record on the `_schemas` topic, key `<subject>/<version>`. */
interface SchemaRecord {
  keytype: 'SCHEMA';
  subject: string;
  version: number;
  id: number;
  schema: string;
}

/** A compatibility record, key `<subject>/config` (`/config` for the global level). */
interface ConfigRecord {
  keytype: 'CONFIG';
  subject: string | null;
  compatibilityLevel: CompatibilityLevel;
}

interface StoredSchema {
  text: string;
  canonical: string;
  type?: avro.Type;
}

const MAX_SUBJECT_LENGTH = 255;
const REPLAY_CHUNK = 1000;

/**
 * A Confluent-compatible registry kept on the `_schemas` topic of an EventLog.
 *
 * Ids and versions are assigned by the single process that owns the registry, one change at a
 * time, and are durable once appended to the log; `start()` rebuilds every subject, version, id
 * and compatibility level by replaying the topic. A distributed deployment therefore runs one
 * registry: this built-in one, served over HTTP by the api process (other processes use it
 * through HttpRegistry), or an external Confluent-compatible one. Two processes that each ran a
 * BuiltInRegistry on the same Kafka topic could hand out the same id twice.
 */
export class BuiltInRegistry implements SchemaRegistry {
  readonly topic = TOPICS.schemas;
  private readonly schemas = new Map<number, StoredSchema>();
  private readonly idByCanonical = new Map<string, number>();
  /** subject -> version -> id, versions in ascending order. */
  private readonly subjectVersions = new Map<string, Map<number, number>>();
  private readonly subjectLevels = new Map<string, CompatibilityLevel>();
  private globalLevel: CompatibilityLevel = DEFAULT_COMPATIBILITY;
  private maxId = 0;
  private started = false;
  /** Changes run one at a time so that ids and versions are never handed out twice. */
  private queue: Promise<unknown> = Promise.resolve();

  constructor(private readonly log: EventLog) {}

  /** Replays the `_schemas` topic (the log must be started with a catalog that holds it). */
  async start(): Promise<void> {
    const ends = await this.log.endOffsets(this.topic);
    for (let partition = 0; partition < ends.length; partition++) {
      const end = ends[partition]!;
      let offset = 0;
      while (offset < end) {
        const records = await this.log.read(this.topic, partition, offset, REPLAY_CHUNK);
        if (records.length === 0) break;
        for (const record of records) this.apply(record);
        offset = records[records.length - 1]!.offset + 1;
      }
    }
    this.started = true;
  }

  // --- the SchemaRegistry seam ---------------------------------------------------------------

  async register(subject: string, schema: string): Promise<number> {
    return (await this.registerVersion(subject, schema)).id;
  }

  async getSchema(id: number): Promise<string> {
    return this.schemaById(id);
  }

  // --- the registry API ----------------------------------------------------------------------

  /**
   * Registers a schema under a subject and returns the version that holds it: the existing one
   * when the subject already has this schema, else a new version after the compatibility check
   * (409 when it fails), with the global id of an identical schema in another subject or a new one.
   */
  registerVersion(subject: string, schema: string): Promise<SubjectVersion> {
    this.assertStarted();
    checkSubject(subject);
    const parsed = parseAvroSchema(schema);
    return this.serial(async () => {
      const existing = this.findInSubject(subject, parsed.canonical);
      if (existing) return existing;
      const level = this.effectiveLevel(subject);
      const result = checkAgainst(parsed.type, this.previousTypes(subject), level);
      if (!result.isCompatible) {
        throw new SchemaRegistryError(
          REGISTRY_ERRORS.incompatible,
          'conflict',
          `Schema being registered is incompatible with an earlier schema for subject "${subject}": ${result.messages.join('; ')}`,
        );
      }
      const id = this.idByCanonical.get(parsed.canonical) ?? this.maxId + 1;
      const versions = this.subjectVersions.get(subject);
      const version = versions && versions.size > 0 ? Math.max(...versions.keys()) + 1 : 1;
      const text = this.schemas.get(id)?.text ?? parsed.text;
      const record: SchemaRecord = { keytype: 'SCHEMA', subject, version, id, schema: text };
      await this.append(`${subject}/${version}`, record);
      this.applySchema(record, parsed.type);
      return { subject, version, id, schema: text };
    });
  }

  /** Subjects that hold at least one version, sorted. */
  subjects(): string[] {
    this.assertStarted();
    return [...this.subjectVersions.entries()]
      .filter(([, v]) => v.size > 0)
      .map(([s]) => s)
      .sort();
  }

  /** Versions of a subject, ascending; 40401 when the subject does not exist. */
  versions(subject: string): number[] {
    return [...this.versionMap(subject).keys()].sort((a, b) => a - b);
  }

  /** One version of a subject (`latest` or -1 for the newest); 40401 / 40402. */
  version(subject: string, version: number | 'latest'): SubjectVersion {
    const versions = this.versionMap(subject);
    const v = version === 'latest' || version === -1 ? Math.max(...versions.keys()) : version;
    const id = versions.get(v);
    if (id === undefined) {
      throw new SchemaRegistryError(REGISTRY_ERRORS.versionNotFound, 'not_found', `Version ${version} not found for subject "${subject}"`);
    }
    return { subject, version: v, id, schema: this.schemas.get(id)!.text };
  }

  /** The schema JSON of a global id; 40403 when there is none. */
  schemaById(id: number): string {
    this.assertStarted();
    const stored = this.schemas.get(id);
    if (!stored) throw new SchemaRegistryError(REGISTRY_ERRORS.schemaNotFound, 'not_found', `Schema ${id} not found`);
    return stored.text;
  }

  /** Subject-version pairs that hold a global id. */
  subjectsOfId(id: number): Array<{ subject: string; version: number }> {
    this.schemaById(id);
    const out: Array<{ subject: string; version: number }> = [];
    for (const [subject, versions] of this.subjectVersions) {
      for (const [version, vid] of versions) if (vid === id) out.push({ subject, version });
    }
    return out.sort((a, b) => a.subject.localeCompare(b.subject) || a.version - b.version);
  }

  /** The version of a subject that holds this schema; 40401 / 40403 when none does. */
  lookup(subject: string, schema: string): SubjectVersion {
    this.versionMap(subject);
    const parsed = parseAvroSchema(schema);
    const found = this.findInSubject(subject, parsed.canonical);
    if (!found) throw new SchemaRegistryError(REGISTRY_ERRORS.schemaNotFound, 'not_found', `Schema not found in subject "${subject}"`);
    return found;
  }

  /** The level that applies to a subject: its own, else the global one. Without a subject, the global one. */
  compatibility(subject?: string): CompatibilityLevel {
    this.assertStarted();
    return subject === undefined ? this.globalLevel : this.effectiveLevel(subject);
  }

  /** The level configured on the subject itself, if any. */
  subjectCompatibility(subject: string): CompatibilityLevel | undefined {
    this.assertStarted();
    return this.subjectLevels.get(subject);
  }

  /** Sets the level of a subject (or the global level without one); durable on the log. */
  setCompatibility(subject: string | undefined, level: CompatibilityLevel): Promise<CompatibilityLevel> {
    this.assertStarted();
    if (!isCompatibilityLevel(level)) {
      throw new SchemaRegistryError(
        REGISTRY_ERRORS.invalidCompatibilityLevel,
        'bad_request',
        `Invalid compatibility level ${JSON.stringify(level)}; valid: ${COMPATIBILITY_LEVELS.join(', ')}`,
      );
    }
    if (subject !== undefined) checkSubject(subject);
    return this.serial(async () => {
      const record: ConfigRecord = { keytype: 'CONFIG', subject: subject ?? null, compatibilityLevel: level };
      await this.append(`${subject ?? ''}/config`, record);
      this.applyConfig(record);
      return level;
    });
  }

  /**
   * Would `schema` be accepted against one version (a number or `latest`) of the subject, or,
   * without a version, against the versions the subject's level checks at registration?
   */
  checkCompatibility(subject: string, schema: string, version?: number | 'latest'): CompatibilityResult {
    const parsed = parseAvroSchema(schema);
    const level = this.effectiveLevel(subject);
    if (version === undefined) {
      if (!this.subjectVersions.get(subject)?.size) return { isCompatible: true, messages: [] };
      return checkAgainst(parsed.type, this.previousTypes(subject), level);
    }
    const target = this.version(subject, version);
    const single = level.replace('_TRANSITIVE', '') as CompatibilityLevel;
    return checkAgainst(parsed.type, [{ version: target.version, type: this.typeOf(target.id) }], single);
  }

  // --- internals -----------------------------------------------------------------------------

  private assertStarted(): void {
    if (!this.started) throw new AppError('unavailable', 'schema registry is not started (call start() first)');
  }

  private serial<T>(task: () => Promise<T>): Promise<T> {
    const run = this.queue.then(task, task);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private async append(key: string, value: SchemaRecord | ConfigRecord): Promise<void> {
    try {
      await this.log.append(this.topic, [{ key, value: Buffer.from(JSON.stringify(value)) }]);
    } catch (err) {
      throw new SchemaRegistryError(REGISTRY_ERRORS.storeError, 'unavailable', `schema registry could not write to ${this.topic}: ${(err as Error).message}`, {
        cause: err,
      });
    }
  }

  private versionMap(subject: string): Map<number, number> {
    this.assertStarted();
    const versions = this.subjectVersions.get(subject);
    if (!versions || versions.size === 0) {
      throw new SchemaRegistryError(REGISTRY_ERRORS.subjectNotFound, 'not_found', `Subject "${subject}" not found`);
    }
    return versions;
  }

  private effectiveLevel(subject: string): CompatibilityLevel {
    return this.subjectLevels.get(subject) ?? this.globalLevel;
  }

  private findInSubject(subject: string, canonical: string): SubjectVersion | undefined {
    const id = this.idByCanonical.get(canonical);
    const versions = this.subjectVersions.get(subject);
    if (id === undefined || !versions) return undefined;
    for (const [version, vid] of versions) {
      if (vid === id) return { subject, version, id, schema: this.schemas.get(id)!.text };
    }
    return undefined;
  }

  private previousTypes(subject: string): Array<{ version: number; type: avro.Type }> {
    const versions = this.subjectVersions.get(subject);
    if (!versions) return [];
    return [...versions.entries()].sort((a, b) => a[0] - b[0]).map(([version, id]) => ({ version, type: this.typeOf(id) }));
  }

  private typeOf(id: number): avro.Type {
    const stored = this.schemas.get(id)!;
    stored.type ??= avro.Type.forSchema(JSON.parse(stored.text) as avro.Schema);
    return stored.type;
  }

  /** Applies one record of the topic (replay); later records of a key replace earlier ones. */
  private apply(record: LogRecord): void {
    const key = record.key ?? '';
    if (record.value === null) {
      // A tombstone: the key's version or config is gone.
      const slash = key.lastIndexOf('/');
      const subject = key.slice(0, slash);
      const rest = key.slice(slash + 1);
      if (rest === 'config') {
        if (subject === '') this.globalLevel = DEFAULT_COMPATIBILITY;
        else this.subjectLevels.delete(subject);
      } else {
        this.subjectVersions.get(subject)?.delete(Number(rest));
      }
      return;
    }
    let value: SchemaRecord | ConfigRecord;
    try {
      value = JSON.parse(record.value.toString('utf8')) as SchemaRecord | ConfigRecord;
    } catch (err) {
      throw new Error(`${this.topic} offset ${record.offset}: record is not JSON: ${(err as Error).message}`);
    }
    if (value.keytype === 'CONFIG') {
      this.applyConfig(value);
    } else if (typeof value.subject === 'string' && Number.isInteger(value.version) && Number.isInteger(value.id) && typeof value.schema === 'string') {
      this.applySchema(value);
    } else {
      throw new Error(`${this.topic} offset ${record.offset}: not a schema registry record`);
    }
  }

  private applySchema(record: SchemaRecord, type?: avro.Type): void {
    let stored = this.schemas.get(record.id);
    if (!stored) {
      const parsed = type ? undefined : parseAvroSchema(record.schema);
      stored = { text: record.schema, canonical: parsed?.canonical ?? JSON.stringify(type!.schema({ exportAttrs: true })), type: type ?? parsed?.type };
      this.schemas.set(record.id, stored);
      if (!this.idByCanonical.has(stored.canonical)) this.idByCanonical.set(stored.canonical, record.id);
    }
    if (record.id > this.maxId) this.maxId = record.id;
    let versions = this.subjectVersions.get(record.subject);
    if (!versions) this.subjectVersions.set(record.subject, (versions = new Map()));
    versions.set(record.version, record.id);
  }

  private applyConfig(record: ConfigRecord): void {
    if (!isCompatibilityLevel(record.compatibilityLevel)) return;
    if (record.subject === null || record.subject === '') this.globalLevel = record.compatibilityLevel;
    else this.subjectLevels.set(record.subject, record.compatibilityLevel);
  }
}

function checkSubject(subject: string): void {
  if (typeof subject !== 'string' || subject.length === 0 || subject.length > MAX_SUBJECT_LENGTH || /[\u0000-\u001f]/.test(subject)) {
    throw new SchemaRegistryError(
      REGISTRY_ERRORS.invalidSchema,
      'bad_request',
      `Invalid subject ${JSON.stringify(subject)}: 1 to ${MAX_SUBJECT_LENGTH} printable characters`,
    );
  }
}

// ---------------------------------------------------------------------------------------------
// An external registry over HTTP
// ---------------------------------------------------------------------------------------------

export interface HttpRegistryOptions {
  /** Base URL, e.g. http://localhost:8081 or http://host:8080/apis/ccompat/v7 (Apicurio). */
  url: string;
  auth?: { username: string; password: string };
  /** Per request. @default 10000 */
  timeoutMs?: number;
  /** Retries of a request that failed on the network, with a 5xx or a 429. @default 3 */
  retries?: number;
}

const CONTENT_TYPE = 'application/vnd.schemaregistry.v1+json';

/**
 * An external Confluent-compatible registry (Confluent, Redpanda, Apicurio ccompat, or this
 * project's built-in one served by the api process) over Confluent's REST API.
 *
 * It speaks REST itself rather than through @kafkajs/confluent-schema-registry's client, whose
 * `register` reads the subject's compatibility level and fails when it differs from the
 * client's own option (BACKWARD by default), and sets that level on a subject's first
 * registration, overriding what operators configured; and whose `getSchema` hands back a parsed
 * avsc Type rather than the schema JSON. The client stays fully usable against the built-in
 * registry (test/contract/schema-evolution.test.ts proves it).
 */
export class HttpRegistry implements SchemaRegistry {
  /** The base URL, without credentials (they travel as a header). */
  readonly base: string;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  private readonly retries: number;
  private readonly byId = new Map<number, string>();
  private readonly idBySubjectSchema = new Map<string, number>();

  constructor(options: HttpRegistryOptions) {
    this.base = options.url.replace(/\/+$/, '');
    this.headers = { accept: `${CONTENT_TYPE}, application/json`, 'content-type': CONTENT_TYPE };
    if (options.auth) {
      this.headers.authorization = `Basic ${Buffer.from(`${options.auth.username}:${options.auth.password}`).toString('base64')}`;
    }
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.retries = options.retries ?? 3;
  }

  async register(subject: string, schema: string): Promise<number> {
    const cacheKey = `${subject}\u0000${schema}`;
    const cached = this.idBySubjectSchema.get(cacheKey);
    if (cached !== undefined) return cached;
    const body = (await this.request('POST', `/subjects/${encodeURIComponent(subject)}/versions`, { schema })) as { id?: unknown };
    if (typeof body.id !== 'number') throw new AppError('internal', `schema registry ${this.base} answered a registration without an id`);
    this.idBySubjectSchema.set(cacheKey, body.id);
    this.byId.set(body.id, schema);
    return body.id;
  }

  async getSchema(id: number): Promise<string> {
    const cached = this.byId.get(id);
    if (cached !== undefined) return cached;
    const body = (await this.request('GET', `/schemas/ids/${id}`)) as { schema?: unknown; schemaType?: unknown };
    if (typeof body.schema !== 'string') throw new AppError('internal', `schema registry ${this.base} answered schema ${id} without a schema`);
    if (body.schemaType !== undefined && body.schemaType !== 'AVRO') {
      throw new AppError('internal', `schema ${id} in ${this.base} is ${String(body.schemaType)}, not AVRO`);
    }
    this.byId.set(id, body.schema);
    return body.schema;
  }

  private async request(method: string, path: string, body?: unknown): Promise<unknown> {
    const url = `${this.base}${path}`;
    for (let attempt = 0; ; attempt++) {
      let response: Response;
      try {
        response = await fetch(url, {
          method,
          headers: this.headers,
          body: body === undefined ? undefined : JSON.stringify(body),
          signal: AbortSignal.timeout(this.timeoutMs),
        });
      } catch (err) {
        if (attempt < this.retries) {
          await delay(attempt);
          continue;
        }
        throw new AppError('unavailable', `schema registry ${this.base} is unreachable (${method} ${path}): ${(err as Error).message}`, { cause: err });
      }
      const text = await response.text();
      let parsed: unknown;
      try {
        parsed = text === '' ? undefined : JSON.parse(text);
      } catch {
        // not JSON: reported below
      }
      if (response.ok) {
        if (parsed === undefined) throw new AppError('internal', `schema registry ${this.base} answered ${method} ${path} with no JSON`);
        return parsed;
      }
      // Busy or failing for now: 5xx, and 429 (a registry's rate limit) after its Retry-After.
      if ((response.status >= 500 || response.status === 429) && attempt < this.retries) {
        await delay(attempt, Number(response.headers.get('retry-after')) * 1000 || 0);
        continue;
      }
      const errorCode = typeof (parsed as { error_code?: unknown })?.error_code === 'number' ? (parsed as { error_code: number }).error_code : response.status;
      const message = typeof (parsed as { message?: unknown })?.message === 'string' ? (parsed as { message: string }).message : text.slice(0, 200);
      throw new SchemaRegistryError(
        errorCode,
        statusToCode(response.status),
        `schema registry ${this.base}: ${method} ${path} failed with ${response.status} (error_code ${errorCode}): ${message}`,
      );
    }
  }
}

function statusToCode(status: number): ErrorCode {
  if (status === 404) return 'not_found';
  if (status === 409) return 'conflict';
  if (status === 401) return 'unauthorized';
  if (status === 403) return 'forbidden';
  if (status === 400 || status === 422) return 'bad_request';
  if (status === 429) return 'rate_limited';
  return 'unavailable';
}

/** Exponential backoff from 100 ms, or the server's Retry-After when longer (at most 10 s). */
function delay(attempt: number, atLeastMs = 0): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.min(10_000, Math.max(100 * 2 ** attempt, atLeastMs))));
}
