/**
 * docs/architecture.md's picture of the actors, the topics between them and the tables they feed
 * is drawn from topics/catalog.yaml (`producers`, `consumers`, `table`) and the sink's
 * projections, and this test holds both to the code:
 *
 * - the parties a topic declares are exactly the folders under services/ whose code names it
 *   (`TOPICS.<key>`; a name in domain/ or queries/ counts for the actors importing that file), so
 *   a new reader or writer cannot go unlisted;
 * - the sink projects exactly the topics that declare a table, and declares itself their consumer;
 * - the generated part of docs/architecture.md is what the catalog draws today.
 *
 * `SVC_UPDATE_DOCS=1 npm test -- test/unit/architecture.test.ts` rewrites the generated part.
 */
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { parse } from 'yaml';
import { TOPICS } from '../../services/kernel/topics.ts';
import { PROJECTIONS } from '../../services/sink/service.ts';
import { REPO } from '../helpers/server.ts';
import { relativeImports, servicesSources } from '../helpers/source-imports.ts';

interface Flow {
  name: string;
  producers: string[];
  consumers: string[];
  table: string | null;
}

const DOC = path.join(REPO, 'docs', 'architecture.md');
const BEGIN = '<!-- generated from topics/catalog.yaml by test/unit/architecture.test.ts: do not edit by hand -->';
const END = '<!-- end of generated part -->';
/** Parties that may appear in the catalog: the actors and the kernel every process carries. */
const PARTIES = ['api', 'sandbox-runner', 'aggregator', 'scorer', 'alerter', 'sink', 'kernel'];

function flows(): Flow[] {
  const doc = parse(readFileSync(path.join(REPO, 'topics', 'catalog.yaml'), 'utf8')) as { topics: Array<Record<string, unknown>> };
  return doc.topics.map((t) => ({
    name: t.name as string,
    producers: (t.producers as string[] | undefined) ?? [],
    consumers: (t.consumers as string[] | undefined) ?? [],
    table: (t.table as string | undefined) ?? null,
  }));
}

/**
 * Topic name -> the parties whose code names it through TOPICS. A shared layer (domain/,
 * queries/) is no party: a topic it names counts for every actor folder that imports that file.
 */
function partiesInCode(): Map<string, Set<string>> {
  const byKey = new Map(Object.entries(TOPICS));
  const files = servicesSources();
  files.delete('kernel/topics.ts');
  const shared = (file: string) => file.startsWith('domain/') || file.startsWith('queries/');
  const importers = (target: string) =>
    [...files].filter(([from, text]) => relativeImports(text).some((spec) => path.posix.join(path.posix.dirname(from), spec) === target)).map(([from]) => from);
  const found = new Map<string, Set<string>>();
  for (const [file, text] of files) {
    for (const [, key] of text.matchAll(/\bTOPICS\.([A-Za-z]+)\b/g)) {
      const name = byKey.get(key);
      assert.ok(name, `services/${file} names TOPICS.${key}, which does not exist`);
      const by = shared(file) ? importers(file).filter((f) => !shared(f)) : [file];
      if (!found.has(name)) found.set(name, new Set());
      for (const f of by) found.get(name)!.add(f.split('/')[0]);
    }
  }
  return found;
}

const id = (prefix: string, name: string) => `${prefix}_${name.replace(/[^A-Za-z0-9]/g, '_')}`;

/** The generated part of docs/architecture.md: a Mermaid picture and the same facts as a table. */
export function render(all: Flow[]): string {
  const parties = PARTIES.filter((p) => all.some((f) => f.producers.includes(p) || f.consumers.includes(p)));
  const picture = [
    'flowchart LR',
    ...parties.map((p) => `  ${id('p', p)}(["${p === 'kernel' ? 'kernel, in every process' : p}"])`),
    ...all.map((f) => `  ${id('t', f.name)}[/"${f.name}"/]`),
    ...all.filter((f) => f.table).map((f) => `  ${id('c', f.table!)}[("${f.table}")]`),
    ...all.flatMap((f) => f.producers.map((p) => `  ${id('p', p)} --> ${id('t', f.name)}`)),
    ...all.flatMap((f) => f.consumers.map((c) => `  ${id('t', f.name)} --> ${id('p', c)}`)),
    ...all.filter((f) => f.table).map((f) => `  ${id('t', f.name)} -. sink .-> ${id('c', f.table!)}`),
  ];
  const rows = all.map((f) => `| \`${f.name}\` | ${f.producers.join(', ')} | ${f.consumers.join(', ')} | ${f.table ? `\`${f.table}\`` : ''} |`);
  return [
    BEGIN,
    '',
    '```mermaid',
    ...picture,
    '```',
    '',
    '| topic | written by | read by | ClickHouse table (the sink) |',
    '|---|---|---|---|',
    ...rows,
    '',
    END,
  ].join('\n');
}

test('every topic declares exactly the parties whose code names it', () => {
  const all = flows();
  const inCode = partiesInCode();
  assert.ok(inCode.size >= 15, `only ${inCode.size} topics named in code`);
  const problems: string[] = [];
  for (const f of all) {
    for (const p of [...f.producers, ...f.consumers]) if (!PARTIES.includes(p)) problems.push(`${f.name}: "${p}" is not a party (${PARTIES.join(', ')})`);
    const declared = [...new Set([...f.producers, ...f.consumers])].sort();
    const actual = [...(inCode.get(f.name) ?? [])].sort();
    if (declared.join() !== actual.join()) problems.push(`${f.name}: the catalog declares [${declared}], the code of [${actual}] names it`);
    if (f.producers.length === 0 || f.consumers.length === 0) problems.push(`${f.name}: needs producers and consumers`);
  }
  assert.deepEqual(problems, []);
});

test('the sink projects exactly the topics that declare a table', () => {
  const withTable = flows().filter((f) => f.table);
  assert.deepEqual(Object.keys(PROJECTIONS).sort(), withTable.map((f) => f.name).sort());
  for (const f of withTable) assert.ok(f.consumers.includes('sink'), `${f.name} has a table but does not name sink among its consumers`);
});

test('docs/architecture.md shows the picture the catalog draws today', () => {
  const doc = readFileSync(DOC, 'utf8');
  const start = doc.indexOf(BEGIN);
  const end = doc.indexOf(END);
  assert.ok(start >= 0 && end > start, `docs/architecture.md lacks the generated part's markers`);
  const expected = render(flows());
  const actual = doc.slice(start, end + END.length);
  if (actual !== expected && process.env.SVC_UPDATE_DOCS === '1') {
    writeFileSync(DOC, doc.slice(0, start) + expected + doc.slice(end + END.length));
    return;
  }
  assert.equal(actual, expected, 'the picture drifted from topics/catalog.yaml: run SVC_UPDATE_DOCS=1 npm test -- test/unit/architecture.test.ts');
});

test('the picture names every party and topic of a catalog, with its table', () => {
  const text = render([
    { name: 'svc.a', producers: ['api'], consumers: ['sink', 'scorer'], table: 'a_rows' },
    { name: 'svc.b', producers: ['scorer'], consumers: ['api'], table: null },
  ]);
  for (const line of ['p_api(["api"])', 'p_scorer --> t_svc_b', 't_svc_a --> p_sink', 't_svc_a -. sink .-> c_a_rows', '| `svc.b` | scorer | api |  |']) {
    assert.ok(text.includes(line), `missing ${line}`);
  }
  assert.ok(!text.includes('p_kernel'), 'a party no topic names is not drawn');
});
