/**
 * The spec document: parsing and the validation the services rely on. Every problem is reported
 * with its path in the document (`resources.timeout: ...`), all of them in one 400.
 * docs/spec-format.md documents the blocks.
 */
import { parse as parseYaml, YAMLParseError } from 'yaml';
import { parseDuration } from './duration.ts';
import { AppError } from './errors.ts';

export interface SpecSetupFile {
  path: string;
  content: string;
  mode: number;
}

export interface SpecFixture {
  type: string;
  from?: string;
  to?: string;
  [key: string]: unknown;
}

export interface SpecDocument {
  version: number;
  id: string;
  base: string;
  task: { prompt: string };
  invariants: Record<string, unknown>;
  secrets: Record<string, string>;
  setup: { files: SpecSetupFile[]; commands: string[]; env: Record<string, string> };
  fixtures: SpecFixture[];
  services: unknown[];
  resources: { timeoutMs: number; memoryBytes: number; cpus: number; pids: number; diskBytes: number | null };
  determinism: { frozenTime: string | null; seed: number | null; dns: Record<string, string> };
  audit: {
    db_writes: boolean;
    http_calls: boolean;
    process_spawns: boolean;
    stdout_capture: boolean;
    file_system: { watch: string[]; track: Array<'writes' | 'reads' | 'deletes'> };
  };
  snapshots: { checkpoints: 'none' | 'per_action' };
  teardown: { always_run: boolean; export: Array<{ type: string; service?: string; to: string }> };
  network: { egress: { default: 'deny' | 'allow'; allow: string[] }; ingress: { default: 'deny' | 'allow' } };
  /** The parsed document as uploaded. */
  raw: Record<string, unknown>;
}

export const SPEC_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;
export const SECRET_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
const SIZE = /^(\d+(?:\.\d+)?)\s*(b|k|kb|ki|kib|m|mb|mi|mib|g|gb|gi|gib)?$/i;
const UNITS: Record<string, number> = { b: 1, k: 1e3, kb: 1e3, ki: 1024, kib: 1024, m: 1e6, mb: 1e6, mi: 1024 ** 2, mib: 1024 ** 2, g: 1e9, gb: 1e9, gi: 1024 ** 3, gib: 1024 ** 3 };

export const SPEC_DEFAULTS = {
  memoryBytes: 512 * 1024 ** 2,
  cpus: 1,
  pids: 256,
} as const;

/** Sizes: an integer of bytes, or `512Mi`, `1Gi`, `500MB`, `2G`. */
export function parseSize(value: unknown): number {
  if (typeof value === 'number' && Number.isInteger(value) && value > 0) return value;
  const m = typeof value === 'string' ? SIZE.exec(value.trim()) : null;
  if (!m) throw new Error('must be a size such as 512Mi, 1Gi, 500MB or a number of bytes');
  const bytes = Math.floor(Number(m[1]) * UNITS[(m[2] ?? 'b').toLowerCase()]);
  if (bytes <= 0) throw new Error('must be more than 0 bytes');
  return bytes;
}

class Problems {
  readonly list: string[] = [];
  add(path: string, problem: string): void {
    this.list.push(`${path}: ${problem}`);
  }
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Parses and validates a spec; throws a 400 listing every problem by its path. */
export function parseSpec(yamlText: string): SpecDocument {
  let doc: unknown;
  try {
    doc = parseYaml(yamlText);
  } catch (err) {
    const where = err instanceof YAMLParseError && err.linePos ? ` at line ${err.linePos[0].line}, column ${err.linePos[0].col}` : '';
    throw new AppError('bad_request', `spec: malformed YAML${where}: ${(err as Error).message.split('\n')[0]}`);
  }
  if (!isObject(doc)) throw new AppError('bad_request', 'spec: the document must be a YAML mapping');
  const p = new Problems();
  const get = <T>(path: string, check: (v: unknown) => T, fallback: T): T => {
    const value = path.split('.').reduce<unknown>((o, k) => (isObject(o) ? o[k] : undefined), doc);
    if (value === undefined || value === null) return fallback;
    try {
      return check(value);
    } catch (err) {
      p.add(path, (err as Error).message);
      return fallback;
    }
  };
  const required = (path: string) => {
    if ((doc as Record<string, unknown>)[path] === undefined) p.add(path, 'is required');
  };
  for (const field of ['version', 'id', 'base', 'task', 'invariants']) required(field);

  const str = (v: unknown) => {
    if (typeof v !== 'string' || v === '') throw new Error('must be a non-empty string');
    return v;
  };
  const bool = (v: unknown) => {
    if (typeof v !== 'boolean') throw new Error('must be true or false');
    return v;
  };
  const strList = (v: unknown) => {
    if (!Array.isArray(v) || !v.every((x) => typeof x === 'string')) throw new Error('must be a list of strings');
    return v as string[];
  };
  const strMap = (v: unknown) => {
    if (!isObject(v)) throw new Error('must be a mapping');
    const out: Record<string, string> = {};
    for (const [k, x] of Object.entries(v)) {
      if (typeof x !== 'string' && typeof x !== 'number' && typeof x !== 'boolean') throw new Error(`${k}: must be a string`);
      out[k] = String(x);
    }
    return out;
  };
  const duration = (v: unknown) => {
    if (typeof v !== 'string' && typeof v !== 'number') throw new Error('must be a duration such as 30s, 5m or an integer of seconds');
    const ms = parseDuration(v);
    if (ms <= 0) throw new Error('must be longer than 0');
    return ms;
  };
  const positiveInt = (v: unknown) => {
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) throw new Error('must be a positive integer');
    return v;
  };
  const positiveNumber = (v: unknown) => {
    if (typeof v !== 'number' || !(v > 0)) throw new Error('must be a positive number');
    return v;
  };

  const version = get('version', (v) => {
    if (v !== 1) throw new Error('must be 1 (the schema version of the spec document)');
    return 1;
  }, 1);
  const id = get('id', (v) => {
    if (typeof v !== 'string' || !SPEC_ID.test(v)) throw new Error('must be 1-128 characters of letters, digits, ".", "_" and "-"');
    return v;
  }, '');
  const base = get('base', str, '');
  const task = get('task', (v) => {
    if (!isObject(v) || typeof v.prompt !== 'string') throw new Error('must be a mapping with a prompt string');
    return { prompt: v.prompt };
  }, { prompt: '' });
  const invariants = get('invariants', (v) => {
    if (!isObject(v)) throw new Error('must be a mapping from invariant name to {check, weight?, gate?}');
    return v;
  }, {});
  const secrets = get('secrets', (v) => {
    if (!isObject(v)) throw new Error('must be a mapping from secret name to its source');
    const out: Record<string, string> = {};
    for (const [name, source] of Object.entries(v)) {
      if (!SECRET_NAME.test(name)) p.add(`secrets.${name}`, 'is not a valid secret name (letters, digits and _)');
      else if (typeof source !== 'string' || !/^(env(:[A-Za-z_][A-Za-z0-9_]*)?|file:\/.+|command:.+|dashboard)$/.test(source)) {
        p.add(`secrets.${name}`, 'must be env, env:<NAME>, file:<absolute path>, command:<cmd> or dashboard');
      } else out[name] = source;
    }
    return out;
  }, {});
  const setupFiles = get('setup.files', (v) => {
    if (!Array.isArray(v)) throw new Error('must be a list of {path, content, mode?}');
    return v.flatMap((f, i): SpecSetupFile[] => {
      if (!isObject(f) || typeof f.path !== 'string' || f.path === '' || typeof f.content !== 'string') {
        p.add(`setup.files[${i}]`, 'must be {path, content, mode?} with string path and content');
        return [];
      }
      let mode = 0o644;
      if (f.mode !== undefined) {
        const m = typeof f.mode === 'string' && /^0?[0-7]{3}$/.test(f.mode) ? parseInt(f.mode, 8) : typeof f.mode === 'number' && f.mode >= 0 && f.mode <= 0o777 ? f.mode : null;
        if (m === null) p.add(`setup.files[${i}].mode`, 'must be an octal mode such as "0644"');
        else mode = m;
      }
      return [{ path: f.path, content: f.content, mode }];
    });
  }, []);
  const setupCommands = get('setup.commands', strList, []);
  const setupEnv = get('setup.env', strMap, {});
  const fixtures = get('fixtures', (v) => {
    if (!Array.isArray(v)) throw new Error('must be a list');
    return v.flatMap((f, i): SpecFixture[] => {
      if (!isObject(f) || typeof f.type !== 'string') {
        p.add(`fixtures[${i}]`, 'must be a mapping with a type');
        return [];
      }
      if (!['copy', 'sql', 'git', 'drift'].includes(f.type)) p.add(`fixtures[${i}].type`, `unknown type "${f.type}"; one of copy, sql, git, drift`);
      if (f.type === 'copy' && (typeof f.from !== 'string' || typeof f.to !== 'string')) p.add(`fixtures[${i}]`, 'a copy fixture needs from and to');
      return [f as SpecFixture];
    });
  }, []);
  const services = get('services', (v) => {
    if (!Array.isArray(v)) throw new Error('must be a list');
    return v;
  }, []);
  const resources = {
    timeoutMs: get('resources.timeout', duration, 10 * 60_000),
    memoryBytes: get('resources.memory', parseSize, SPEC_DEFAULTS.memoryBytes),
    cpus: get('resources.cpus', positiveNumber, SPEC_DEFAULTS.cpus),
    pids: get('resources.pids', positiveInt, SPEC_DEFAULTS.pids),
    diskBytes: get('resources.disk', parseSize, null as number | null),
  };
  get('resources.concurrency_limit', positiveInt, 0);
  const determinism = {
    frozenTime: get('determinism.frozen_time', (v) => {
      const text = v instanceof Date ? v.toISOString() : v;
      if (typeof text !== 'string' || Number.isNaN(Date.parse(text))) throw new Error('must be an ISO 8601 time');
      return new Date(text).toISOString();
    }, null as string | null),
    seed: get('determinism.seed', (v) => {
      if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new Error('must be a non-negative integer');
      return v;
    }, null as number | null),
    dns: get('determinism.dns', strMap, {}),
  };
  const track = get('audit.file_system.track', (v) => {
    const list = strList(v);
    for (const t of list) if (!['writes', 'reads', 'deletes'].includes(t)) throw new Error(`unknown "${t}"; writes, reads or deletes`);
    return list as Array<'writes' | 'reads' | 'deletes'>;
  }, ['writes', 'deletes'] as Array<'writes' | 'reads' | 'deletes'>);
  const audit = {
    db_writes: get('audit.db_writes', bool, false),
    http_calls: get('audit.http_calls', bool, false),
    process_spawns: get('audit.process_spawns', bool, false),
    stdout_capture: get('audit.stdout_capture', bool, false),
    file_system: { watch: get('audit.file_system.watch', strList, []), track },
  };
  const snapshots = {
    checkpoints: get('snapshots.checkpoints', (v) => {
      if (v !== 'per_action' && v !== 'none') throw new Error('must be per_action or none');
      return v;
    }, 'none' as 'none' | 'per_action'),
  };
  const teardown = {
    always_run: get('teardown.always_run', bool, false),
    export: get('teardown.export', (v) => {
      if (!Array.isArray(v)) throw new Error('must be a list of {type, to, service?}');
      return v.flatMap((e, i) => {
        if (!isObject(e) || typeof e.type !== 'string' || typeof e.to !== 'string') {
          p.add(`teardown.export[${i}]`, 'must be {type, to, service?}');
          return [];
        }
        if (!['audit_log', 'db_dump', 'snapshot'].includes(e.type)) p.add(`teardown.export[${i}].type`, `unknown type "${e.type}"; audit_log, db_dump or snapshot`);
        if (e.to.split('/').includes('..') || e.to.startsWith('/')) p.add(`teardown.export[${i}].to`, 'must be a relative path without ..');
        return [{ type: e.type, to: e.to, ...(typeof e.service === 'string' ? { service: e.service } : {}) }];
      });
    }, []),
  };
  const defaultPolicy = (v: unknown) => {
    if (v !== 'deny' && v !== 'allow') throw new Error('must be deny or allow');
    return v;
  };
  const network = {
    egress: { default: get('network.egress.default', defaultPolicy, 'deny' as 'deny' | 'allow'), allow: get('network.egress.allow', strList, []) },
    ingress: { default: get('network.ingress.default', defaultPolicy, 'deny' as 'deny' | 'allow') },
  };
  if (p.list.length > 0) throw new AppError('bad_request', `spec: ${p.list.join('; ')}`);
  return {
    version,
    id,
    base,
    task,
    invariants,
    secrets,
    setup: { files: setupFiles, commands: setupCommands, env: setupEnv },
    fixtures,
    services,
    resources,
    determinism,
    audit,
    snapshots,
    teardown,
    network,
    raw: doc,
  };
}
