/**
 * What the `sql` invariant reads: the objects that were there when the sandbox became ready, not
 * ones the agent put in their place. readResolvable() notes, at ready and again before each check,
 * what a query's names resolve to; refuseReplaced() throws when a name the query uses (or the
 * syntax uses for it) now resolves otherwise. The grader's role, search_path and read-only
 * transaction are postgres.ts's; this file only compares the catalogs.
 */
import type pg from 'pg';

/**
 * What a query's names resolve to, in the database's own schemas: relations by qualified name,
 * functions by name and operators by symbol (every overload, with its definition), and the casts.
 */
export interface Resolvable {
  relations: Map<string, Relation>;
  functions: Map<string, string>;
  operators: Map<string, string>;
  casts: string;
  /** the tables that have inheritance children, with them: a child's rows are read through its parent */
  inherited: Map<string, string>;
  /** the database's own functions, and the views calling them: code that names relations in text, resolved when it runs */
  code: Set<string>;
}

interface Relation {
  name: string;
  /** oid and kind: the same name with another identity is another object (what a redefined view, or an altered table, reads is a ddl record's business) */
  identity: string;
  kind: string;
}

const RELATION_KINDS: Record<string, string> = { r: 'table', p: 'table', v: 'view', m: 'materialized view', f: 'foreign table', S: 'sequence' };
const OWN_SCHEMA = `n.nspname NOT IN ('pg_catalog', 'information_schema', 'svc_internal') AND n.nspname !~ '^pg_(toast|temp)'`;

export async function readResolvable(client: pg.Client): Promise<Resolvable> {
  const relations = await client.query<{ schema: string; name: string; oid: string; relkind: string }>(`
    SELECT n.nspname AS schema, c.relname AS name, c.oid::text AS oid, c.relkind::text AS relkind
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S') AND ${OWN_SCHEMA}`);
  // A row's whole text is its definition: body, argument types, strictness, the function behind
  // an operator. Functions only when named like a built-in: changing its own functions may be the
  // agent's task (a ddl record says it did), shadowing count() is not. Not those of the bootstrap
  // superuser (oid 10): a trusted extension's (citext's lower(citext)), which the agent can
  // install but not write.
  const overloads = async (catalog: 'pg_proc' | 'pg_operator', only = ''): Promise<Map<string, string>> => {
    const column = catalog === 'pg_proc' ? 'pro' : 'opr';
    const { rows } = await client.query<{ name: string; versions: string }>(`
      SELECT o.${column}name::text AS name, string_agg(md5(o.*::text), ',' ORDER BY o.oid) AS versions
      FROM pg_catalog.${catalog} o JOIN pg_catalog.pg_namespace n ON n.oid = o.${column}namespace
      WHERE ${OWN_SCHEMA} AND o.${column}owner <> 10 ${only} GROUP BY 1`);
    return new Map(rows.map((r) => [r.name, r.versions]));
  };
  // a cast needs its type's owner (or a superuser): those of the agent's types
  const casts = await client.query<{ casts: string | null }>(`
    SELECT string_agg(md5(c.*::text), ',' ORDER BY c.oid) AS casts FROM pg_catalog.pg_cast c
    WHERE EXISTS (SELECT 1 FROM pg_catalog.pg_type t WHERE t.oid IN (c.castsource, c.casttarget) AND t.typowner <> 10)`);
  // a child table's rows are in every read of its parent (and of the views over it), written under the child's name
  const inherited = await client.query<{ parent: string; children: string }>(`
    SELECT n.nspname || '.' || p.relname AS parent, string_agg(i.inhrelid::text, ',' ORDER BY i.inhrelid) AS children
    FROM pg_catalog.pg_inherits i JOIN pg_catalog.pg_class p ON p.oid = i.inhparent JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace
    WHERE p.relkind = 'r' GROUP BY 1`);
  // a function's body names relations in text (a view's rules hold their oids): a call reads what is there when it runs
  const code = await client.query<{ name: string }>(`
    WITH RECURSIVE calling(relid) AS (
      SELECT r.ev_class FROM pg_catalog.pg_depend d JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid
      JOIN pg_catalog.pg_proc o ON o.oid = d.refobjid JOIN pg_catalog.pg_namespace n ON n.oid = o.pronamespace
      WHERE d.classid = 'pg_catalog.pg_rewrite'::regclass AND d.refclassid = 'pg_catalog.pg_proc'::regclass AND ${OWN_SCHEMA} AND o.proowner <> 10
      UNION SELECT r.ev_class FROM calling c JOIN pg_catalog.pg_depend d ON d.refobjid = c.relid AND d.refclassid = 'pg_catalog.pg_class'::regclass
      JOIN pg_catalog.pg_rewrite r ON r.oid = d.objid AND d.classid = 'pg_catalog.pg_rewrite'::regclass)
    SELECT c.relname::text AS name FROM calling JOIN pg_catalog.pg_class c ON c.oid = calling.relid
    UNION SELECT o.proname::text FROM pg_catalog.pg_proc o JOIN pg_catalog.pg_namespace n ON n.oid = o.pronamespace WHERE ${OWN_SCHEMA} AND o.proowner <> 10`);
  return {
    relations: new Map(
      relations.rows.map((r) => [`${r.schema}.${r.name}`, { name: r.name, identity: `${r.oid} ${r.relkind}`, kind: RELATION_KINDS[r.relkind] ?? 'relation' }]),
    ),
    inherited: new Map(inherited.rows.map((r) => [r.parent, r.children])),
    code: new Set(code.rows.map((r) => r.name)),
    functions: await overloads(
      'pg_proc',
      `AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc b WHERE b.proname = o.proname AND b.pronamespace = 'pg_catalog'::regnamespace)`,
    ),
    operators: await overloads('pg_operator'),
    casts: casts.rows[0]?.casts ?? '',
  };
}

/**
 * Throws when `sql` names something that resolves otherwise than at ready: a relation that is now
 * another object of that name (or any such, when it runs a function of the database's own, or a
 * view calling one: a function's body finds relations, functions and operators by name when it
 * runs, so every change below counts for it), a function named like a built-in in the database's schemas made
 * or changed since (a count(integer) beside the built-in count("any") wins for an integer
 * column), an operator of the database's schemas made or changed since (spelt, or used by the
 * syntax: SYNTAX_OPERATORS), a cast, or a table whose inheritance children changed (a child's rows
 * are in every read of its parent, the audit naming the child alone).
 */
export function refuseReplaced(sql: string, ready: Resolvable, now: Resolvable): void {
  const words = identifiers(sql);
  const refuse = (why: string): never => {
    throw new Error(`the query ${why} since the sandbox became ready: the check reads only what was there, not what the agent put in its place`);
  };
  // a function of the database's own (or a view calling one) the query runs: its body names what it reads and calls in text
  const running = [...now.code].find((name) => words.has(name));
  for (const [key, before] of ready.relations) {
    const after = now.relations.get(key);
    if (!after || after.identity === before.identity) continue;
    const what = after.kind !== before.kind ? `a ${after.kind}, no longer the ${before.kind} it was,` : `another ${after.kind}`;
    if (words.has(before.name)) refuse(`reads ${key}, ${what}`);
    if (running) refuse(`runs ${running}, the database's own code, which may read ${key} by its name: ${what}`);
  }
  // made, changed or gone (a fixture's child cut off takes its rows out of the parent's reads)
  const changed = (before: Map<string, string>, after: Map<string, string>): string[] =>
    [...new Set([...before.keys(), ...after.keys()])].filter((key) => before.get(key) !== after.get(key));
  for (const parent of changed(ready.inherited, now.inherited))
    refuse(`may read ${parent}, a table with inheritance children (rows read through it) made or changed`);
  for (const name of changed(ready.functions, now.functions)) {
    if (words.has(name) || running) refuse(`calls ${name}, a function named like a built-in made or changed`);
  }
  const implied = new Set([...words].flatMap((word) => SYNTAX_OPERATORS[word] ?? []));
  for (const symbol of changed(ready.operators, now.operators)) {
    if (sql.includes(symbol) || implied.has(symbol) || running) refuse(`may use the operator ${symbol}, made or changed`);
  }
  if (now.casts !== ready.casts) refuse('may use a cast made or changed');
}

/**
 * The operators SQL's own syntax looks up on the search_path without spelling them: `x IN (...)`,
 * `CASE x WHEN`, NULLIF, IS DISTINCT FROM, JOIN ... USING use `=` (NOT IN `<>`), BETWEEN `>=` and
 * `<=`, LIKE `~~` (an agent's `=` on varchar beats the built-in's for `code IN ('a')`, there being
 * no varchar = varchar in pg_catalog). The functions of the syntax (TRIM, AT TIME ZONE) are
 * pg_catalog's by the grammar.
 */
const SYNTAX_OPERATORS: Record<string, string[]> = {
  in: ['=', '<>'],
  any: ['=', '<>'],
  some: ['=', '<>'],
  all: ['=', '<>'],
  case: ['='],
  nullif: ['='],
  distinct: ['='],
  using: ['='],
  natural: ['='],
  between: ['>=', '<=', '<', '>'],
  like: ['~~', '!~~'],
  ilike: ['~~*', '!~~*'],
  similar: ['~', '!~'],
};

/** The identifiers `sql` may name (unquoted ones folded to lower case as PostgreSQL does), string literals left out. */
function identifiers(sql: string): Set<string> {
  const words = new Set<string>();
  for (const match of sql.replace(/'(?:[^']|'')*'/g, ' ').matchAll(/"((?:[^"]|"")*)"|([\p{L}_][\p{L}\p{N}_$]*)/gu)) {
    // PostgreSQL folds only A-Z of an unquoted name (Äpfel stays Äpfel in UTF-8)
    words.add(match[1] !== undefined ? match[1].replace(/""/g, '"') : match[2]!.replace(/[A-Z]+/g, (upper) => upper.toLowerCase()));
  }
  return words;
}
