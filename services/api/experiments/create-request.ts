/**
 * The body of POST /v1/experiments: parsed and checked on its own (every problem, each naming
 * its field, in one 400), then against the spec it names. docs/experiments.md documents it.
 */
import type { ExperimentOptions } from '../../domain/events/experiment-events.ts';
import { type Params, referencedParams } from '../../domain/params.ts';
import { SECRET_NAME, type SpecDataset, type SpecDocument } from '../../domain/spec.ts';
import { DATASET_NAME, TAG } from '../../domain/datasets.ts';
import { type Bad, FieldProblems } from '../field-problems.ts';
import { isObject } from '../../kernel/is-object.ts';

const NAME_MAX = 200;
const MATRIX_MAX = 1000;
const REPLICAS_MAX = 100;
const PARAM_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const CREATE_FIELDS = ['name', 'spec_id', 'secrets', 'spec_version', 'agent_snapshot_id', 'matrix', 'replicas', 'seed', 'dataset', 'run'];
const DATASET_FIELDS = ['id', 'name', 'version', 'tags', 'record_ids'];
const RECORD_IDS_MAX = 10_000;

export interface CreateRequest {
  name: string;
  spec_id: string;
  secrets: Record<string, string>;
  options: ExperimentOptions;
  /** The request's dataset, which replaces the spec's; resolved and pinned (options.dataset) at creation. */
  dataset: DatasetRequest | null;
  run: boolean;
}

/** `dataset` of the request: the spec's form, plus `record_ids` (a reproducer's: these records only). */
export type DatasetRequest = SpecDataset & { record_ids?: string[] };

function parseSecrets(raw: unknown, bad: Bad): Record<string, string> {
  const secrets: Record<string, string> = {};
  if (raw === undefined || raw === null) return secrets;
  if (!isObject(raw)) {
    bad('secrets', 'must be an object of secret name to string value');
    return secrets;
  }
  for (const [name, value] of Object.entries(raw)) {
    if (!SECRET_NAME.test(name)) bad(`secrets.${name}`, 'is not a valid secret name (letters, digits and _, not starting with a digit)');
    else if (typeof value !== 'string') bad(`secrets.${name}`, 'must be a string');
    else secrets[name] = value;
  }
  return secrets;
}

/** The request's matrix when every entry is a map of parameter name to a string, number or boolean; undefined after reporting what is not. */
function parseMatrix(raw: unknown, bad: Bad): Params[] | undefined {
  if (!Array.isArray(raw) || raw.length === 0 || raw.length > MATRIX_MAX) {
    bad('matrix', `must be a list of 1 to ${MATRIX_MAX} parameter maps, e.g. [{"lang": "python"}, {"lang": "go"}]`);
    return undefined;
  }
  let valid = true;
  const invalid: Bad = (field, problem) => {
    valid = false;
    bad(field, problem);
  };
  for (const [i, entry] of (raw as unknown[]).entries()) {
    if (!isObject(entry)) {
      invalid(`matrix[${i}]`, 'must be a map of parameter name to value');
      continue;
    }
    for (const [name, value] of Object.entries(entry)) {
      if (!PARAM_NAME.test(name)) invalid(`matrix[${i}].${name}`, 'is not a parameter name (letters, digits and _, not starting with a digit)');
      else if (typeof value !== 'string' && typeof value !== 'boolean' && !(typeof value === 'number' && Number.isFinite(value))) {
        invalid(`matrix[${i}].${name}`, 'must be a string, a number or a boolean');
      }
    }
  }
  return valid ? (raw as Params[]) : undefined;
}

/** The overrides of the spec's defaults, in the order they are stored. */
function parseOptions(b: Record<string, unknown>, bad: Bad): ExperimentOptions {
  const options: ExperimentOptions = {};
  if (b.spec_version !== undefined) {
    if (!Number.isInteger(b.spec_version) || (b.spec_version as number) < 1) bad('spec_version', 'must be a positive integer');
    else options.spec_version = b.spec_version as number;
  }
  if (b.agent_snapshot_id !== undefined) {
    if (typeof b.agent_snapshot_id !== 'string' || b.agent_snapshot_id === '') bad('agent_snapshot_id', 'must be an agent snapshot id (snap_...)');
    else options.agent_snapshot_id = b.agent_snapshot_id;
  }
  if (b.matrix !== undefined) {
    const matrix = parseMatrix(b.matrix, bad);
    if (matrix) options.matrix = matrix;
  }
  if (b.replicas !== undefined) {
    if (!Number.isInteger(b.replicas) || (b.replicas as number) < 1 || (b.replicas as number) > REPLICAS_MAX)
      bad('replicas', `must be a whole number from 1 to ${REPLICAS_MAX}`);
    else options.replicas = b.replicas as number;
  }
  if (b.seed !== undefined) {
    if (!Number.isSafeInteger(b.seed) || (b.seed as number) < 0) bad('seed', 'must be a non-negative integer');
    else options.seed = b.seed as number;
  }
  return options;
}

/** `dataset`: exactly one of id and name, a version, tags and record ids; null after reporting what is wrong. */
function parseDataset(raw: unknown, bad: Bad): DatasetRequest | null {
  if (!isObject(raw)) {
    bad('dataset', 'must be an object {id | name, version?, tags?, record_ids?}');
    return null;
  }
  let valid = true;
  const invalid: Bad = (field, problem) => {
    valid = false;
    bad(field, problem);
  };
  for (const field of Object.keys(raw))
    if (!DATASET_FIELDS.includes(field)) invalid(`dataset.${field}`, `unknown field; accepted: ${DATASET_FIELDS.join(', ')}`);
  if ((raw.id === undefined) === (raw.name === undefined)) invalid('dataset', 'needs exactly one of id (ds_...) and name');
  if (raw.id !== undefined && (typeof raw.id !== 'string' || !/^ds_[0-9a-f]{16}$/.test(raw.id)))
    invalid('dataset.id', 'must be a dataset id, ds_ and 16 hex digits');
  if (raw.name !== undefined && (typeof raw.name !== 'string' || !DATASET_NAME.test(raw.name)))
    invalid('dataset.name', 'must be a dataset name of 1 to 200 characters');
  if (raw.version !== undefined && (!Number.isInteger(raw.version) || (raw.version as number) < 1)) invalid('dataset.version', 'must be a positive integer');
  const strings = (field: 'tags' | 'record_ids', max: number, accepts: (s: string) => boolean, what: string) => {
    const list = raw[field];
    if (list === undefined) return;
    if (!Array.isArray(list) || list.length === 0 || list.length > max) return invalid(`dataset.${field}`, `must be a list of 1 to ${max} ${what}s`);
    list.forEach((item: unknown, i: number) => {
      if (typeof item !== 'string' || !accepts(item)) invalid(`dataset.${field}[${i}]`, `is not a ${what}`);
    });
  };
  strings('tags', 100, (t) => TAG.test(t), 'tag');
  strings('record_ids', RECORD_IDS_MAX, (id) => /^rec_[0-9a-f]{16}$/.test(id), 'record id (rec_ and 16 hex digits)');
  return valid ? (raw as DatasetRequest) : null;
}

/** Every problem of a creation body, each naming its field, in one 400. */
export function parseCreateRequest(b: Record<string, unknown>): CreateRequest {
  const problems = new FieldProblems();
  const { bad } = problems;
  for (const field of Object.keys(b)) if (!CREATE_FIELDS.includes(field)) bad(field, `unknown field; accepted: ${CREATE_FIELDS.join(', ')}`);
  if (typeof b.name !== 'string' || b.name.trim() === '') bad('name', 'is required: a non-empty string');
  else if (b.name.length > NAME_MAX) bad('name', `must be at most ${NAME_MAX} characters`);
  if (typeof b.spec_id !== 'string' || b.spec_id === '') bad('spec_id', 'is required: the id of a stored spec');
  const secrets = parseSecrets(b.secrets, bad);
  const options = parseOptions(b, bad);
  const dataset = b.dataset === undefined || b.dataset === null ? null : parseDataset(b.dataset, bad);
  if (b.run !== undefined && typeof b.run !== 'boolean') bad('run', 'must be true or false');
  problems.throwIfAny();
  return { name: b.name as string, spec_id: b.spec_id as string, secrets, options, dataset, run: b.run === true };
}

/** A request matrix entry must define every parameter the spec refers to. */
export function matrixProblems(doc: SpecDocument, matrix: Params[] | undefined): string[] {
  if (!matrix) return [];
  const referenced = [...referencedParams(doc.raw)];
  return matrix.flatMap((entry, i) =>
    referenced.filter((name) => !Object.hasOwn(entry, name)).map((name) => `matrix[${i}]: lacks ${name}, which the spec refers to as {{ params.${name} }}`),
  );
}
