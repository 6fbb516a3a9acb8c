/**
 * Event values in the Confluent wire format: magic byte 0, the writer schema's registry id as
 * a 4-byte big-endian integer, then the Avro binary encoding. The same bytes travel in the
 * embedded log and in Kafka, so any Confluent-aware tool can read our topics.
 *
 * Subjects follow Confluent's TopicNameStrategy: the value schema of topic `T` is registered
 * under subject `T-value`, `T` as the log names it (with SVC_LOG_NAMESPACE's prefix, so a tool
 * that looks a topic's schema up by its name finds it). `init()` registers this process's schema for every topic of the
 * catalog that has one (an already registered schema keeps its id), and `encode` writes with it.
 * `decode` reads values written with any registered version: a value whose writer id differs
 * from this process's is read through an avsc resolver (writer schema -> this process's reader
 * schema), built once per writer id, so old and new versions of a service interoperate under
 * the registry's compatibility rules.
 *
 * Encoding and decoding are synchronous once the schemas are known; only a writer id never seen
 * before needs the registry, which `decode` / `decodeMany` fetch first.
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';
import avro from 'avsc';
import type { TopicSpec } from '../log/event-log.ts';
import { REPO_ROOT } from '../topics.ts';
import type { SchemaRegistry } from './registry.ts';

const DEFAULT_SCHEMAS_DIR = join(REPO_ROOT, 'schemas');
const MAGIC_BYTE = 0;
const HEADER_SIZE = 5;

/** TopicNameStrategy: the registry subject of a topic's values. */
export function valueSubject(topic: string): string {
  return `${topic}-value`;
}

/** A value that does not match its topic's schema (encode), or bytes that cannot be read (decode). */
export class SerdeError extends Error {
  /** Path of the first invalid field, e.g. `events[3].ts_ns` (encode only). */
  readonly path?: string;
  constructor(message: string, options: { path?: string; cause?: unknown } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'SerdeError';
    this.path = options.path;
  }
}

interface TopicCodec {
  topic: string;
  id: number;
  type: avro.Type;
  /** Writer id -> resolver into `type` (null: the writer schema equals the reader schema). */
  resolvers: Map<number, avro.Resolver | null>;
}

/** Reads the writer id of a wire-format value (magic byte checked). */
function writerId(buf: Buffer, topic = 'value'): number {
  if (!Buffer.isBuffer(buf) || buf.length < HEADER_SIZE) {
    throw new SerdeError(
      `${topic}: not a Confluent wire-format value (${Buffer.isBuffer(buf) ? `${buf.length} bytes` : typeof buf}, need at least ${HEADER_SIZE})`,
    );
  }
  if (buf[0] !== MAGIC_BYTE) {
    throw new SerdeError(`${topic}: unknown magic byte ${buf[0]} (expected ${MAGIC_BYTE}, the Confluent wire format)`);
  }
  return buf.readUInt32BE(1);
}

/** Writes values in the wire format through one growing scratch buffer (ingest workers use it too). */
export class WireEncoder {
  private scratch = Buffer.allocUnsafe(64 * 1024);

  /** The wire-format bytes of `value` written with `type` under registry id `id`; avsc throws on an invalid value. */
  encode(type: avro.Type, id: number, value: unknown): Buffer {
    let end = type.encode(value, this.scratch, HEADER_SIZE);
    if (end < 0) {
      // Too small: `end` is minus the missing bytes. Grow and write again.
      this.scratch = Buffer.allocUnsafe(Math.max(this.scratch.length * 2, this.scratch.length - end + 1024));
      end = type.encode(value, this.scratch, HEADER_SIZE);
    }
    const out = Buffer.allocUnsafe(end);
    out[0] = MAGIC_BYTE;
    out.writeUInt32BE(id, 1);
    this.scratch.copy(out, HEADER_SIZE, HEADER_SIZE, end);
    return out;
  }
}

export class EventSerde {
  private readonly codecs = new Map<string, TopicCodec>();
  /** Writer schemas by registry id, shared by every topic (ids are global). */
  private readonly writers = new Map<number, Promise<avro.Type>>();
  private readonly encoder = new WireEncoder();

  constructor(
    private readonly registry: SchemaRegistry,
    private readonly catalog: TopicSpec[],
    private readonly schemasDir: string = DEFAULT_SCHEMAS_DIR,
    /** The log's topic prefix (SVC_LOG_NAMESPACE): catalog names here, prefixed ones on the log. */
    private readonly namespace = '',
  ) {}

  /** The registry subject of a catalog topic's values: `<namespace><topic>-value`. */
  subject(topic: string): string {
    return valueSubject(`${this.namespace}${topic}`);
  }

  /** Registers each topic's value schema under its subject and caches its id and type. */
  async init(): Promise<void> {
    await Promise.all(
      this.catalog
        .filter((spec) => spec.valueSchema !== null)
        .map(async (spec) => {
          const file = join(this.schemasDir, `${spec.valueSchema}.avsc`);
          let text: string;
          try {
            text = await readFile(file, 'utf8');
          } catch (err) {
            throw new Error(`topic ${spec.name}: value schema ${file} cannot be read: ${(err as Error).message}`, { cause: err });
          }
          let type: avro.Type;
          try {
            type = avro.Type.forSchema(JSON.parse(text) as avro.Schema);
          } catch (err) {
            throw new Error(`topic ${spec.name}: ${file} is not a valid Avro schema: ${(err as Error).message}`, { cause: err });
          }
          const id = await this.registry.register(this.subject(spec.name), JSON.stringify(JSON.parse(text)));
          this.codecs.set(spec.name, { topic: spec.name, id, type, resolvers: new Map([[id, null]]) });
          this.writers.set(id, Promise.resolve(type));
        }),
    );
  }

  /** The registry id this process writes a topic's values with. */
  schemaId(topic: string): number {
    return this.codec(topic).id;
  }

  /** This process's (reader and writer) Avro type of a topic's values. */
  type(topic: string): avro.Type {
    return this.codec(topic).type;
  }

  /** Encodes a value in the wire format; a SerdeError naming the first invalid field otherwise. */
  encode(topic: string, value: unknown): Buffer {
    const codec = this.codec(topic);
    try {
      return this.encoder.encode(codec.type, codec.id, value);
    } catch (err) {
      throw this.invalid(codec, value, err);
    }
  }

  /** Decodes one value, fetching its writer schema from the registry when it is new. */
  async decode<T = unknown>(topic: string, buf: Buffer): Promise<T> {
    const codec = this.codec(topic);
    const id = writerId(buf, topic);
    if (!codec.resolvers.has(id)) await this.prepare(codec, id);
    return this.read<T>(codec, id, buf);
  }

  /** Decodes many values of one topic: unknown writer ids are fetched first, then all is sync. */
  async decodeMany<T = unknown>(topic: string, bufs: readonly Buffer[]): Promise<T[]> {
    const codec = this.codec(topic);
    const ids = bufs.map((buf) => writerId(buf, topic));
    const unknown = [...new Set(ids.filter((id) => !codec.resolvers.has(id)))];
    if (unknown.length > 0) await Promise.all(unknown.map((id) => this.prepare(codec, id)));
    const out = new Array<T>(bufs.length);
    for (let i = 0; i < bufs.length; i++) out[i] = this.read<T>(codec, ids[i]!, bufs[i]!);
    return out;
  }

  /**
   * A value's Avro body (its bytes after the wire header) as this process's schema of the topic
   * writes it: the bytes themselves when that schema wrote them, else decoded through the
   * resolver and encoded again (values from an older or newer service during an upgrade).
   */
  async currentBody(topic: string, buf: Buffer): Promise<Buffer> {
    const codec = this.codec(topic);
    const id = writerId(buf, topic);
    if (id === codec.id) return buf.subarray(HEADER_SIZE);
    const value = await this.decode(topic, buf);
    return codec.type.toBuffer(value);
  }

  /**
   * Decodes synchronously; throws when the writer id has not been seen by this process yet
   * (use decode / decodeMany, which fetch it).
   */
  decodeSync<T = unknown>(topic: string, buf: Buffer): T {
    const codec = this.codec(topic);
    const id = writerId(buf, topic);
    if (!codec.resolvers.has(id)) {
      throw new SerdeError(`${topic}: writer schema ${id} is not loaded yet (decode with decode() or decodeMany())`);
    }
    return this.read<T>(codec, id, buf);
  }

  private read<T>(codec: TopicCodec, id: number, buf: Buffer): T {
    const resolver = codec.resolvers.get(id);
    let result: { value: unknown; offset: number };
    try {
      result = resolver ? codec.type.decode(buf, HEADER_SIZE, resolver) : codec.type.decode(buf, HEADER_SIZE);
    } catch (err) {
      throw new SerdeError(`${codec.topic}: value written with schema ${id} cannot be decoded: ${(err as Error).message}`, { cause: err });
    }
    if (result.offset !== buf.length) {
      throw new SerdeError(
        result.offset < 0
          ? `${codec.topic}: value written with schema ${id} is truncated (${buf.length} bytes)`
          : `${codec.topic}: value written with schema ${id} has ${buf.length - result.offset} trailing bytes`,
      );
    }
    return result.value as T;
  }

  private async prepare(codec: TopicCodec, id: number): Promise<void> {
    let writer = this.writers.get(id);
    if (!writer) {
      writer = this.fetchWriter(id);
      this.writers.set(id, writer);
      writer.catch(() => this.writers.delete(id)); // retry on the next value
    }
    const writerType = await writer;
    if (codec.resolvers.has(id)) return;
    if (writerType.equals(codec.type)) {
      codec.resolvers.set(id, null);
      return;
    }
    try {
      codec.resolvers.set(id, codec.type.createResolver(writerType));
    } catch (err) {
      throw new SerdeError(
        `${codec.topic}: values written with schema ${id} cannot be read with this process's schema ${codec.id} (${this.subject(codec.topic)}): ${(err as Error).message}`,
        { cause: err },
      );
    }
  }

  private async fetchWriter(id: number): Promise<avro.Type> {
    let text: string;
    try {
      text = await this.registry.getSchema(id);
    } catch (err) {
      throw new SerdeError(`writer schema ${id} is not available from the schema registry: ${(err as Error).message}`, { cause: err });
    }
    try {
      return avro.Type.forSchema(JSON.parse(text) as avro.Schema);
    } catch (err) {
      throw new SerdeError(`writer schema ${id} from the registry is not a valid Avro schema: ${(err as Error).message}`, { cause: err });
    }
  }

  private codec(topic: string): TopicCodec {
    const codec = this.codecs.get(topic);
    if (codec) return codec;
    const spec = this.catalog.find((t) => t.name === topic);
    if (!spec) throw new SerdeError(`topic ${topic} is not in the topic catalog`);
    if (spec.valueSchema === null) throw new SerdeError(`topic ${topic} has no value schema (its values are raw bytes)`);
    throw new SerdeError(`event serde is not initialised (call init() before encoding ${topic})`);
  }

  private invalid(codec: TopicCodec, value: unknown, cause: unknown): SerdeError {
    let first: { path: string; value: unknown; type: string } | undefined;
    codec.type.isValid(value, {
      errorHook: (path: string[], v: unknown, type: avro.Type) => {
        first ??= { path: formatPath(path), value: v, type: describe(type) };
      },
    });
    if (!first) return new SerdeError(`${codec.topic}: value cannot be encoded: ${(cause as Error).message}`, { cause });
    const got = first.value === undefined ? 'nothing (field missing)' : truncate(safeJson(first.value));
    return new SerdeError(`${codec.topic}: invalid value at ${first.path || '(root)'}: expected ${first.type}, got ${got}`, {
      path: first.path,
      cause,
    });
  }
}

function formatPath(path: string[]): string {
  let out = '';
  for (const part of path) out += /^\d+$/.test(part) ? `[${part}]` : out === '' ? part : `.${part}`;
  return out;
}

function describe(type: avro.Type): string {
  const name = type.typeName;
  if (name === 'union:unwrapped' || name === 'union:wrapped') {
    return (type as unknown as { types: avro.Type[] }).types.map(describe).join(' or ');
  }
  return type.name ? `${name} ${type.name}` : name;
}

function safeJson(v: unknown): string {
  try {
    return typeof v === 'bigint' ? `${v}n` : (JSON.stringify(v) ?? String(v));
  } catch {
    return String(v);
  }
}

function truncate(s: string): string {
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}
