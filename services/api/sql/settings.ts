/**
 * The settings of an analyst's query, from its URL parameters: ClickHouse's own settings that
 * the engine knows, except the ones that would lift the read-only mode or the limits, or write
 * logs; `param_<name>` bound into `{name:Type}`. The limits (SVC_SQL_*) may only be lowered, and
 * readonly=1 and the limits are enforced by coming last.
 */
import { SETTING_NAME } from '../../kernel/store/store.ts';
import { SqlError } from './sql-errors.ts';

/** URL parameters of ClickHouse's HTTP interface that are not settings. */
const RESERVED = new Set([
  'query',
  'database',
  'default_format',
  'user',
  'password',
  'quota_key',
  'query_id',
  'session_id',
  'session_timeout',
  'session_check',
  'compress',
  'decompress',
  'client_protocol_version',
  'buffer_size',
  'wait_end_of_query',
  'enable_http_compression',
  'http_zlib_compression_level',
  'role',
]);

/** Settings a URL may not change: they would lift the read-only mode or the limits, or write logs. */
const DENIED_SETTINGS =
  /^(allow_ddl|allow_introspection_functions|max_memory_usage_for_user|max_untracked_memory|memory_.*|.*overcommit.*|max_server_memory_usage.*|max_concurrent_queries.*|send_logs_.*|log_.*|opentelemetry_.*|profile|user_files_path)$/;

/** The limits every query runs with; a URL may ask for less. */
export interface QueryLimits {
  /** Seconds. */
  max_execution_time: number;
  max_memory_usage: number;
  max_result_bytes: number;
}

const LIMITS: ReadonlyArray<keyof QueryLimits> = ['max_execution_time', 'max_memory_usage', 'max_result_bytes'];

function positiveNumber(name: string, raw: string): number {
  if (!/^\d+(\.\d+)?$/.test(raw.trim()))
    throw new SqlError(27, 'CANNOT_PARSE_INPUT_ASSERTION_FAILED', `Cannot parse ${JSON.stringify(raw)} as a number for setting ${name}`, 400);
  return Number(raw);
}

/** Refuses a URL parameter that is not a setting the engine knows, or whose value cannot be one. */
function checkSetting(name: string, value: string, known: ReadonlySet<string>): void {
  if (/_(format|structure|types)$/.test(name) && !known.has(name)) {
    throw new SqlError(48, 'NOT_IMPLEMENTED', `External tables (${name}) are not supported here`, 400);
  }
  if (!SETTING_NAME.test(name) || !known.has(name)) {
    throw new SqlError(
      115,
      'UNKNOWN_SETTING',
      `Unknown setting '${name}': URL parameters other than ClickHouse's own (query, database, default_format, query_id, param_<name>, ...) must be settings`,
    );
  }
  if (/[\0\r\n]/.test(value) || value.length > 4096) throw new SqlError(27, 'CANNOT_PARSE_INPUT_ASSERTION_FAILED', `Bad value for setting ${name}`);
}

/**
 * The settings (in order, the enforced ones last: the last occurrence of a setting wins) and
 * the query parameters of a query's URL parameters, given the engine's setting names.
 */
export function querySettings(
  params: URLSearchParams,
  known: ReadonlySet<string>,
  limits: QueryLimits,
): { settings: Array<[string, string]>; queryParams: Record<string, string> } {
  const settings: Array<[string, string]> = [];
  const queryParams: Record<string, string> = {};
  const lowered = { ...limits };
  for (const [name, value] of params) {
    if (name.startsWith('param_')) {
      const param = name.slice('param_'.length);
      if (!SETTING_NAME.test(param)) throw new SqlError(457, 'BAD_QUERY_PARAMETER', `Bad query parameter name ${JSON.stringify(param)}`);
      queryParams[param] = value;
      continue;
    }
    if (RESERVED.has(name)) continue;
    checkSetting(name, value, known);
    if (name === 'readonly') {
      if (value.trim() === '1' || value.trim() === '2') continue; // the query runs with readonly=1 anyway
      throw new SqlError(164, 'READONLY', "Cannot modify 'readonly' setting in readonly mode");
    }
    const limit = LIMITS.find((l) => l === name);
    if (limit) {
      const asked = positiveNumber(name, value);
      if (asked > 0) lowered[limit] = Math.min(asked, lowered[limit]);
      continue;
    }
    if (DENIED_SETTINGS.test(name)) throw new SqlError(164, 'READONLY', `Cannot modify '${name}' setting in readonly mode`);
    settings.push([name, value]);
  }
  settings.push(['readonly', '1'], ...LIMITS.map((l): [string, string] => [l, String(lowered[l])]));
  return { settings, queryParams };
}
