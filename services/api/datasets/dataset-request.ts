/**
 * The bodies and queries of the datasets endpoints (docs/datasets.md), parsed and checked: every
 * problem names its field, all of them in one 400.
 */
import { DATASET_NAME, DESCRIPTION_MAX, type NewRecord, recordBytes, TAG, TAGS_PER_RECORD_MAX } from '../../domain/datasets.ts';
import type { Config } from '../../kernel/config.ts';
import { badRequest } from '../../kernel/errors.ts';
import { isObject } from '../../kernel/is-object.ts';
import { type Bad, FieldProblems } from '../field-problems.ts';
import { decodeCursor, parseLimit } from '../pagination.ts';

const CREATE_FIELDS = ['name', 'description'];
const RECORD_FIELDS = ['input', 'expected', 'metadata', 'tags'];

export interface CreateDataset {
  name: string;
  description: string | null;
}

/** POST /v1/datasets: `{name, description?}`. */
export function parseCreateDataset(b: Record<string, unknown>): CreateDataset {
  const problems = new FieldProblems();
  const { bad } = problems;
  for (const field of Object.keys(b)) if (!CREATE_FIELDS.includes(field)) bad(field, `unknown field; accepted: ${CREATE_FIELDS.join(', ')}`);
  if (typeof b.name !== 'string' || b.name.trim() === '') bad('name', 'is required: a non-empty string');
  else if (!DATASET_NAME.test(b.name)) bad('name', 'must be 1 to 200 characters, without control characters or spaces at either end');
  if (b.description !== undefined && b.description !== null && typeof b.description !== 'string') bad('description', 'must be a string');
  else if (typeof b.description === 'string' && b.description.length > DESCRIPTION_MAX) bad('description', `must be at most ${DESCRIPTION_MAX} characters`);
  problems.throwIfAny();
  return { name: b.name as string, description: (b.description as string | null | undefined) ?? null };
}

/** One record of an add; undefined after reporting what is wrong with it. */
function parseRecord(raw: unknown, where: string, maxBytes: number, bad: Bad): NewRecord | undefined {
  if (!isObject(raw)) return void bad(where, 'must be an object {input, expected?, metadata?, tags?}');
  let valid = true;
  const invalid: Bad = (field, problem) => {
    valid = false;
    bad(field, problem);
  };
  for (const field of Object.keys(raw))
    if (!RECORD_FIELDS.includes(field)) invalid(`${where}.${field}`, `unknown field; accepted: ${RECORD_FIELDS.join(', ')}`);
  if (raw.input === undefined || raw.input === null) invalid(`${where}.input`, 'is required: any JSON value but null');
  const tags = raw.tags ?? [];
  if (!Array.isArray(tags) || tags.length > TAGS_PER_RECORD_MAX) invalid(`${where}.tags`, `must be a list of at most ${TAGS_PER_RECORD_MAX} tags`);
  else {
    tags.forEach((tag: unknown, i: number) => {
      if (typeof tag !== 'string' || !TAG.test(tag))
        invalid(`${where}.tags[${i}]`, 'must be a tag of 1 to 100 characters without commas, control characters or spaces at either end');
    });
    if (new Set(tags).size !== tags.length) invalid(`${where}.tags`, 'lists a tag twice');
  }
  if (!valid) return undefined;
  const record: NewRecord = {
    input: raw.input,
    tags: tags as string[],
    ...(raw.expected !== undefined && { expected: raw.expected }),
    ...(raw.metadata !== undefined && { metadata: raw.metadata }),
  };
  const bytes = recordBytes(record);
  if (bytes > maxBytes) return void bad(where, `is ${bytes} bytes, over the record size limit of ${maxBytes} bytes (SVC_DATASET_RECORD_BYTES)`);
  return record;
}

/**
 * POST /v1/datasets/:id/records: a list of records, bare or as `{records: [...]}`. A list longer
 * than a dataset may ever hold is a 400 here; one that would take this dataset past it, a 409 of
 * the catalog's.
 */
export function parseRecords(body: unknown, config: Pick<Config, 'datasetRecordBytes' | 'datasetMaxRecords'>): NewRecord[] {
  const problems = new FieldProblems();
  const { bad } = problems;
  let list: unknown = body;
  if (isObject(body)) {
    for (const field of Object.keys(body)) if (field !== 'records') bad(field, 'unknown field; send a list of records, or {records: [...]}');
    list = body.records;
  }
  if (!Array.isArray(list) || list.length === 0) bad('records', 'is required: a non-empty list of records {input, expected?, metadata?, tags?}');
  else if (list.length > config.datasetMaxRecords)
    bad('records', `has ${list.length} records, more than a dataset may hold (${config.datasetMaxRecords}, SVC_DATASET_MAX_RECORDS)`);
  problems.throwIfAny();
  const records = (list as unknown[]).map((r, i) => parseRecord(r, `records[${i}]`, config.datasetRecordBytes, bad));
  problems.throwIfAny();
  return records as NewRecord[];
}

/** `tags=a,b`: the tags of an any-of filter, or null without one. */
export function parseTagsFilter(raw: unknown): string[] | null {
  if (raw === undefined) return null;
  const tags = String(raw)
    .split(',')
    .map((t) => t.trim())
    .filter((t) => t !== '');
  if (tags.length === 0) throw badRequest('tags', 'must name at least one tag (comma-separated)');
  for (const tag of tags) if (!TAG.test(tag)) throw badRequest('tags', `${JSON.stringify(tag)} is not a tag (1 to 100 characters without control characters)`);
  return tags;
}

export interface RecordQuery {
  /** null: the newest. */
  version: number | null;
  tags: string[] | null;
  /** The seq of the previous page's last record (0: from the start). */
  after: number;
  limit: number;
}

/** GET /v1/datasets/:id/records: `version`, `tags`, `limit`, `cursor`. */
export function parseRecordQuery(q: Record<string, unknown>, config: Config): RecordQuery {
  let version: number | null = null;
  if (q.version !== undefined) {
    if (typeof q.version !== 'string' || !/^[1-9]\d{0,8}$/.test(q.version)) throw badRequest('version', 'must be a positive integer');
    version = Number(q.version);
  }
  const cursor = decodeCursor(q.cursor, 1);
  if (cursor && !/^\d{1,9}$/.test(cursor[0])) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  return { version, tags: parseTagsFilter(q.tags), after: cursor ? Number(cursor[0]) : 0, limit: parseLimit(q.limit, config) };
}
