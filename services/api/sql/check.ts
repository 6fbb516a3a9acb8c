/**
 * What the SQL endpoint checks in an analyst's query before the engine sees it, on top of the
 * engine's own `readonly=1` (which refuses every write, DDL, SET, SYSTEM, OPTIMIZE, a SETTINGS
 * clause that changes a setting, and most table functions). Measured on chDB 3.4 (26.7), readonly
 * does *not* refuse: `KILL QUERY` (it would kill the service's own queries), `INTO OUTFILE`
 * (writes a file), the scalar `file()` (reads any file), `DESCRIBE file(...)`, several
 * statements in one request (chDB runs them all), `USE`. So this module lexes the query the way
 * ClickHouse's lexer does (strings, quoted identifiers, heredocs, `--`, `# `, `#!` and nested
 * block comments) and refuses:
 *
 * - more than one statement (ClickHouse's own HTTP rule);
 * - a statement other than SELECT, WITH, SHOW, DESCRIBE/DESC, EXPLAIN, EXISTS;
 * - `INTO OUTFILE`;
 * - a call of a table function that reads files or the network (every table function but an
 *   allow-list of generators and local-table readers), and the `file()` and `catboostEvaluate()`
 *   functions, named plainly or quoted.
 *
 * It also finds the query's FORMAT clause, which wins over `default_format`.
 */
import { SqlError } from './sql-errors.ts';

type TokenKind = 'word' | 'quoted' | 'string' | 'number' | 'punct';
interface Token {
  kind: TokenKind;
  /** The word or quoted identifier's name; the punctuation character; '' for others. */
  text: string;
  pos: number;
}

/** Table functions that read only generated data or the service's own tables. */
const SAFE_TABLE_FUNCTIONS = new Set([
  'numbers',
  'numbers_mt',
  'zeros',
  'zeros_mt',
  'generaterandom',
  'generate_series',
  'generateseries',
  'primes',
  'values',
  'view',
  'viewifpermitted',
  'viewexplain',
  'merge',
  'null',
  'loop',
  'format',
  'sqlstandardvalues',
  'dictionary',
  'mergetreeindex',
  'mergetreeprojection',
  'mergetreetextindex',
  'mergetreeanalyzeindexes',
  'mergetreeanalyzeindexesuuid',
]);

/**
 * The table functions of chDB 26.7 (system.table_functions) that reach outside the service's
 * tables; the endpoint adds whatever the running engine lists beyond the safe set (denyTableFunctions).
 */
const DENIED = new Set([
  'file',
  'filecluster',
  'url',
  'urlcluster',
  's3',
  's3cluster',
  'gcs',
  'oss',
  'cosn',
  'hdfs',
  'hdfscluster',
  'azureblobstorage',
  'azureblobstoragecluster',
  'remote',
  'remotesecure',
  'cluster',
  'clusterallreplicas',
  'mysql',
  'postgresql',
  'sqlite',
  'mongodb',
  'redis',
  'jdbc',
  'odbc',
  'executable',
  'input',
  'iceberg',
  'icebergs3',
  'icebergazure',
  'iceberghdfs',
  'iceberglocal',
  'icebergcluster',
  'icebergs3cluster',
  'icebergazurecluster',
  'iceberghdfscluster',
  'iceberglocalcluster',
  'deltalake',
  'deltalakes3',
  'deltalakeazure',
  'deltalakelocal',
  'deltalakecluster',
  'deltalakes3cluster',
  'deltalakeazurecluster',
  'hudi',
  'hudicluster',
  'paimon',
  'paimons3',
  'paimonazure',
  'paimonhdfs',
  'paimonlocal',
  'paimoncluster',
  'paimons3cluster',
  'paimonazurecluster',
  'paimonhdfscluster',
  'ytsaurus',
  'filesystem',
  'arrowstream',
  'eval',
  'fuzzquery',
  'fuzzjson',
  'prometheusquery',
  'prometheusqueryrange',
  'timeseriesselector',
  'timeseriesmetrics',
  'timeseriestags',
  'timeseriessamples',
  'timeseriesdata',
  // Scalar functions that read files.
  'catboostevaluate',
]);

/** Adds the engine's own table functions that are not in the safe set (a newer chDB's new ones included). */
export function denyTableFunctions(names: Iterable<string>): void {
  for (const name of names) if (!SAFE_TABLE_FUNCTIONS.has(name.toLowerCase())) DENIED.add(name.toLowerCase());
}

const STATEMENTS = new Set(['select', 'with', 'show', 'describe', 'desc', 'explain', 'exists']);
/** ClickHouse statements that write or change state: refused as READONLY (anything else is a syntax error). */
const WRITES = new Set([
  'insert',
  'create',
  'drop',
  'alter',
  'truncate',
  'system',
  'kill',
  'optimize',
  'set',
  'use',
  'rename',
  'attach',
  'detach',
  'grant',
  'revoke',
  'exchange',
  'undrop',
  'delete',
  'update',
  'backup',
  'restore',
  'watch',
  'move',
  'check',
  'begin',
  'commit',
  'rollback',
  'replace',
  'execute',
  'prepare',
  'deallocate',
  'copy',
  'merge',
]);

function syntaxError(sql: string, pos: number, what: string): SqlError {
  return new SqlError(62, 'SYNTAX_ERROR', `Syntax error: failed at position ${pos + 1} (${JSON.stringify(sql.slice(pos, pos + 20))}): ${what}`);
}

/** Where a block comment starting at `start` ends (just after it closes); comments nest, as in ClickHouse. */
function blockCommentEnd(sql: string, start: number): number {
  const n = sql.length;
  let i = start;
  let depth = 0;
  while (i < n) {
    if (sql[i] === '/' && sql[i + 1] === '*') {
      depth++;
      i += 2;
    } else if (sql[i] === '*' && sql[i + 1] === '/') {
      depth--;
      i += 2;
      if (depth === 0) break;
    } else i++;
  }
  if (depth !== 0) throw syntaxError(sql, start, 'unterminated comment');
  return i;
}

/** The string literal or quoted identifier starting at `start`: its text (escapes and doubled quotes undone) and where it ends. */
function readQuoted(sql: string, start: number): { text: string; end: number } {
  const n = sql.length;
  const c = sql[start];
  let text = '';
  let i = start + 1;
  for (;;) {
    if (i >= n) throw syntaxError(sql, start, c === "'" ? 'unterminated string literal' : 'unterminated quoted identifier');
    const d = sql[i];
    if (d === '\\' && i + 1 < n) {
      text += sql[i + 1];
      i += 2;
    } else if (d === c) {
      if (sql[i + 1] !== c) return { text, end: i + 1 };
      text += c;
      i += 2;
    } else {
      text += d;
      i++;
    }
  }
}

/** ClickHouse's tokens, comments dropped. Throws a syntax error for an unterminated string or comment. */
function tokenize(sql: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i];
    if (/\s/.test(c)) {
      i++;
    } else if (c === '-' && sql[i + 1] === '-') {
      while (i < n && sql[i] !== '\n') i++;
    } else if (c === '#' && (sql[i + 1] === ' ' || sql[i + 1] === '!')) {
      while (i < n && sql[i] !== '\n') i++;
    } else if (c === '/' && sql[i + 1] === '*') {
      i = blockCommentEnd(sql, i);
    } else if (c === "'" || c === '"' || c === '`') {
      const quoted = readQuoted(sql, i);
      tokens.push({ kind: c === "'" ? 'string' : 'quoted', text: c === "'" ? '' : quoted.text, pos: i });
      i = quoted.end;
    } else if (c === '$' && /^\$[A-Za-z0-9_]*\$/.test(sql.slice(i, i + 64))) {
      // Heredoc string: $tag$ ... $tag$
      const tag = /^\$[A-Za-z0-9_]*\$/.exec(sql.slice(i, i + 64))![0];
      const end = sql.indexOf(tag, i + tag.length);
      if (end < 0) throw syntaxError(sql, i, 'unterminated heredoc');
      tokens.push({ kind: 'string', text: '', pos: i });
      i = end + tag.length;
    } else if (/[A-Za-z_]/.test(c)) {
      const start = i;
      while (i < n && /[A-Za-z0-9_$]/.test(sql[i])) i++;
      tokens.push({ kind: 'word', text: sql.slice(start, i), pos: start });
    } else if (/[0-9]/.test(c)) {
      const start = i;
      while (i < n && /[A-Za-z0-9_.]/.test(sql[i])) {
        // exponent sign: 1e+10
        if ((sql[i] === 'e' || sql[i] === 'E') && (sql[i + 1] === '+' || sql[i + 1] === '-')) i++;
        i++;
      }
      tokens.push({ kind: 'number', text: '', pos: start });
    } else {
      tokens.push({ kind: 'punct', text: c, pos: i });
      i++;
    }
  }
  return tokens;
}

export interface CheckedQuery {
  /** The FORMAT clause's format, when the query has one (it wins over default_format). */
  format: string | null;
}

/** Refuses what a read-only analyst endpoint must not run (see the module comment); finds the FORMAT clause. */
export function checkQuery(sql: string): CheckedQuery {
  const tokens = tokenize(sql);
  // One statement: a `;` may only end it.
  const semicolon = tokens.findIndex((t) => t.kind === 'punct' && t.text === ';');
  if (semicolon >= 0 && semicolon < tokens.length - 1) {
    const next = tokens.slice(semicolon + 1).find((t) => !(t.kind === 'punct' && t.text === ';'));
    if (next)
      throw new SqlError(
        62,
        'SYNTAX_ERROR',
        `Syntax error (Multi-statements are not allowed): failed at position ${tokens[semicolon].pos + 1}: one statement per request`,
      );
  }
  const body = semicolon >= 0 ? tokens.slice(0, semicolon) : tokens;
  const first = body.find((t) => !(t.kind === 'punct' && t.text === '('));
  if (!first) throw new SqlError(62, 'SYNTAX_ERROR', 'Empty query');
  if (first.kind !== 'word' || (!STATEMENTS.has(first.text.toLowerCase()) && !WRITES.has(first.text.toLowerCase()))) {
    throw syntaxError(sql, first.pos, 'expected one of SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS');
  }
  if (!STATEMENTS.has(first.text.toLowerCase())) {
    throw new SqlError(
      164,
      'READONLY',
      `${first.kind === 'word' ? first.text.toUpperCase() : 'This'} query is refused: this endpoint is read-only and runs only SELECT, WITH, SHOW, DESCRIBE, EXPLAIN and EXISTS`,
    );
  }
  let depth = 0;
  let format: string | null = null;
  for (let i = 0; i < body.length; i++) {
    const t = body[i];
    const next = body[i + 1];
    if (t.kind === 'punct') {
      if (t.text === '(') depth++;
      else if (t.text === ')') depth--;
      continue;
    }
    if ((t.kind === 'word' || t.kind === 'quoted') && next?.kind === 'punct' && next.text === '(' && DENIED.has(t.text.toLowerCase())) {
      throw new SqlError(164, 'READONLY', `${t.text}() reads files or the network and is refused: this endpoint reads only the service's tables`);
    }
    if (t.kind === 'word' && t.text.toUpperCase() === 'INTO' && next?.kind === 'word' && next.text.toUpperCase() === 'OUTFILE') {
      throw new SqlError(164, 'READONLY', 'INTO OUTFILE writes a file and is refused: the result comes back in the response');
    }
    // FORMAT <name> at the end of the statement, or before its trailing SETTINGS clause.
    const after = body[i + 2];
    if (
      depth === 0 &&
      t.kind === 'word' &&
      t.text.toUpperCase() === 'FORMAT' &&
      (next?.kind === 'word' || next?.kind === 'quoted') &&
      (after === undefined || (after.kind === 'word' && after.text.toUpperCase() === 'SETTINGS'))
    ) {
      format = next.text;
    }
  }
  return { format };
}
