/**
 * Matrix parameters: the one grammar of `{{ params.NAME }}` in a spec's strings. A matrix entry
 * (parallelism.matrix, or an experiment's own) gives each NAME a value; spec validation, the
 * experiment request's matrix check and the run's spec all read references through this file.
 *
 * A scenario made from a dataset record (docs/datasets.md) carries the record in its params too,
 * under the reserved name RECORD_PARAM (never a parameter name: those are identifiers), so it
 * travels wherever params do (the run request, the runner, the scorer, run_scores) without a new
 * field. Its `{{ input... }}` and `{{ expected... }}` templates are replaced in the same single
 * pass as `{{ params.NAME }}` (a value is never scanned again), and `input` reaches every command
 * as SVC_INPUT. `expected` reaches no command's environment, since the agent's commands share it:
 * only invariants and grader files may name it (recordTemplateProblems), so the checks see the
 * answer and the agent never does.
 */
import { childPath } from '../kernel/json-schema.ts';
import { shellQuote } from '../kernel/shell.ts';

export type ParamValue = string | number | boolean;
/** One matrix entry: parameter name -> value. Names are identifiers (the spec's JSON Schema). */
export type Params = Record<string, ParamValue>;

/**
 * A reference as written. The name is taken as written, identifier or not, so a reference no
 * matrix can define (`{{ params.a-b }}`) is reported by validation instead of staying literal.
 */
const REFERENCE = /\{\{\s*params\.([^}\s]*)\s*\}\}/g;

/** The parameter names a string refers to, in order. */
export function referencedNames(text: string): string[] {
  return [...text.matchAll(REFERENCE)].map((m) => m[1]);
}

/**
 * Every reference of a string replaced by its value, in one pass: `{{ params.NAME }}` by the
 * entry's (a name the entry lacks stays as written), and, in a scenario of a dataset record, its
 * `{{ input... }}` and `{{ expected... }}` (renderRecordValue).
 */
export function applyParams(text: string, params: Params): string {
  const record = scenarioRecord(params);
  return text.replace(
    TEMPLATE,
    (match, name: string | undefined, field: 'input' | 'expected' | undefined, path: string | undefined, filter: string | undefined) => {
      if (name !== undefined) return Object.hasOwn(params, name) && name !== RECORD_PARAM ? String(params[name]) : match;
      if (record === null || (filter !== undefined && !RECORD_FILTERS.includes(filter as RecordFilter))) return match;
      return renderRecordValue(valueAt(record[field!], path ?? ''), filter as RecordFilter | undefined);
    },
  );
}

/**
 * Matrix entries reach the agent and the checks as SVC_PARAM_<NAME> environment variables; a
 * dataset record as SVC_INPUT (its input as JSON), SVC_RECORD_ID and SVC_DATASET_ID. Never its
 * `expected`: the agent's commands get this environment too.
 */
export function paramsEnv(params: Params): Record<string, string> {
  const record = scenarioRecord(params);
  return {
    ...Object.fromEntries(
      Object.entries(params)
        .filter(([name]) => name !== RECORD_PARAM)
        .map(([name, value]) => [`SVC_PARAM_${name.toUpperCase()}`, String(value)]),
    ),
    ...(record && { SVC_INPUT: JSON.stringify(record.input), SVC_RECORD_ID: record.id, SVC_DATASET_ID: record.dataset_id }),
  };
}

// --- dataset records -------------------------------------------------------------------------

/** The reserved params name of a scenario's dataset record: not an identifier, so no matrix can define it. */
export const RECORD_PARAM = 'svc.record';

/** The record a scenario of a dataset runs (docs/datasets.md), as its params carry it. */
export interface ScenarioRecord {
  dataset_id: string;
  /** The record's id and the version of the add that created it. */
  id: string;
  version: number;
  input: unknown;
  /** Absent when the record has none. */
  expected?: unknown;
  metadata?: unknown;
  tags: string[];
}

/** A matrix entry with a record: the params of one scenario of a dataset. */
export function withRecord(entry: Params, record: ScenarioRecord): Params {
  return { ...entry, [RECORD_PARAM]: JSON.stringify(record) };
}

/** The record of a scenario's params, or null for a scenario of a matrix alone. */
export function scenarioRecord(params: Params): ScenarioRecord | null {
  const text = params[RECORD_PARAM];
  return typeof text === 'string' ? (JSON.parse(text) as ScenarioRecord) : null;
}

/** The matrix entry of a scenario's params, without its record. */
export function matrixPart(params: Params): Params {
  const { [RECORD_PARAM]: _record, ...entry } = params;
  return entry;
}

/** `| json`: the value as JSON text; `| shell`: as one single-quoted shell word. */
export type RecordFilter = 'json' | 'shell';
export const RECORD_FILTERS: readonly RecordFilter[] = ['json', 'shell'];

/**
 * `{{ params.NAME }}` (group 1), or `{{ input }}` / `{{ expected }}` (group 2) with an optional
 * path of keys and array indices (`.question`, `.items.0`; group 3) and filter (`| json`; group 4).
 */
const TEMPLATE = /\{\{\s*(?:params\.([^}\s]*)|(input|expected)((?:\.[^\s.|}]+)*)\s*(?:\|\s*([A-Za-z_]+)\s*)?)\s*\}\}/g;
/** The start of a record template, to find the malformed ones (`{{ input. }}`, `{{ expected | upper }}`). */
const RECORD_START = /\{\{\s*(input|expected)\b/g;

/** The value at a path (`.a.0.b`) of a record field; undefined when any step is missing. */
export function valueAt(value: unknown, path: string): unknown {
  let at = value;
  for (const step of path.split('.').slice(1)) {
    if (Array.isArray(at) && /^\d+$/.test(step)) at = at[Number(step)];
    else if (at !== null && typeof at === 'object' && !Array.isArray(at) && Object.hasOwn(at, step)) at = (at as Record<string, unknown>)[step];
    else return undefined;
  }
  return at;
}

/**
 * A record value as it replaces its template: a string as it is, any other JSON value as JSON
 * text, missing or null as nothing; `json` gives JSON text always (`null` when missing), `shell`
 * one single-quoted word of the text.
 */
export function renderRecordValue(value: unknown, filter?: RecordFilter): string {
  if (filter === 'json') return JSON.stringify(value ?? null);
  const text = value === undefined || value === null ? '' : typeof value === 'string' ? value : JSON.stringify(value);
  return filter === 'shell' ? shellQuote(text) : text;
}

/** Whether a document path lies where `{{ expected }}` may be named: the checks' own blocks. */
function gradersOnly(path: string): boolean {
  return ['invariants', 'grader'].some((block) => path === block || path.startsWith(`${block}.`) || path.startsWith(`${block}[`));
}

/** The record fields (`input`, `expected`) a string's well-formed templates name. */
export function referencedRecordFields(text: string): Array<'input' | 'expected'> {
  return [...text.matchAll(TEMPLATE)].flatMap((m) => (m[2] === undefined ? [] : [m[2] as 'input' | 'expected']));
}

/**
 * What is wrong with the record templates of one string at `path` of a spec: one that does not
 * parse or names an unknown filter, and `{{ expected }}` outside invariants and grader files.
 */
export function recordTemplateProblems(path: string, text: string): string[] {
  const problems: string[] = [];
  const wellFormed = new Set<number>();
  for (const m of text.matchAll(TEMPLATE)) {
    if (m[2] === undefined) continue;
    wellFormed.add(m.index);
    if (m[4] !== undefined && !RECORD_FILTERS.includes(m[4] as RecordFilter))
      problems.push(`${m[0]}: unknown filter "${m[4]}"; one of ${RECORD_FILTERS.join(', ')}`);
    if (m[2] === 'expected' && !gradersOnly(path))
      problems.push(`${m[0]}: the expected answer may be named only in invariants and grader files, which the agent never sees`);
  }
  for (const m of text.matchAll(RECORD_START)) {
    if (wellFormed.has(m.index)) continue;
    const close = text.indexOf('}}', m.index);
    const written = text.slice(m.index, close < 0 ? m.index + 40 : close + 2);
    problems.push(`${written}: not a record template; write {{ ${m[1]} }} or {{ ${m[1]}.key.0 }}, optionally with | json or | shell`);
  }
  return problems;
}

/** Whether a document path lies under `parallelism`, whose strings define parameters rather than use them. */
export function definesParams(path: string): boolean {
  return path === 'parallelism' || path.startsWith('parallelism.');
}

/** The parameter names a parsed spec document's strings refer to (outside parallelism). */
export function referencedParams(doc: Record<string, unknown>): Set<string> {
  const names = new Set<string>();
  const visit = (value: unknown): void => {
    if (typeof value === 'string') for (const name of referencedNames(value)) names.add(name);
    else if (Array.isArray(value)) value.forEach(visit);
    else if (value !== null && typeof value === 'object') Object.values(value).forEach(visit);
  };
  for (const [key, value] of Object.entries(doc)) if (!definesParams(key)) visit(value);
  return names;
}

/** Every string of a parsed spec document (a tree: spec.ts refuses loops first) with its path. */
function* documentStrings(value: unknown, path = ''): Generator<[string, string]> {
  if (typeof value === 'string') yield [path, value];
  else if (Array.isArray(value)) for (const [i, item] of value.entries()) yield* documentStrings(item, `${path}[${i}]`);
  else if (value !== null && typeof value === 'object') for (const [key, item] of Object.entries(value)) yield* documentStrings(item, childPath(path, key));
}

/** The record templates' problems of a whole spec document, each with its path (spec.ts reports them with the rest). */
export function specRecordProblems(doc: Record<string, unknown>): Array<{ path: string; problem: string }> {
  return [...documentStrings(doc)].flatMap(([path, text]) =>
    text.includes('{{') ? recordTemplateProblems(path, text).map((problem) => ({ path, problem })) : [],
  );
}

/** Where a spec document names its record (`{{ input }}`, `{{ expected }}`): an experiment of it needs a dataset. */
export function recordReferences(doc: Record<string, unknown>): string[] {
  return [...documentStrings(doc)].filter(([, text]) => text.includes('{{') && referencedRecordFields(text).length > 0).map(([path]) => path);
}
