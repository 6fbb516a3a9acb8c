/**
 * GET /v1/experiments/:id/export: the export bundle, the experiment (with its metrics), its
 * spec, then every scenario followed by its runs (each with the runner's full outcome and its
 * sandbox's audit records), as NDJSON lines or one JSON document. docs/experiments.md documents
 * it. Runs and audit records are read a page at a time, so an experiment of any size streams in
 * bounded memory.
 */
import { Readable } from 'node:stream';
import { computeMetrics, type RunTraceStats } from '../../domain/experiment-metrics.ts';
import type { ExperimentChanged } from '../../domain/events/experiment-events.ts';
import { badRequest } from '../../kernel/errors.ts';
import type { Kernel } from '../../kernel/actor.ts';
import type { Store } from '../../kernel/store/store.ts';
import { runFacts, runTraceStats } from '../../queries/run-facts.ts';
import type { PinnedPlan } from '../catalogs/experiment-catalog.ts';
import { allAuditRecords, auditStored, type AuditItem } from '../sandboxes/audit-reads.ts';
import { ScenarioParamsWindow } from './scenario-params.ts';
import {
  experimentDetail,
  RUN_COLUMNS,
  scenarioResult,
  type ExperimentDetail,
  type ResultContext,
  type RunResult,
  type RunRow,
  type ScenarioResult,
} from './run-results.ts';

const EXPORT_PAGE = 500;
/** Audit records read at a time for a run's `audit`. */
const AUDIT_PAGE = 1000;

export type ExportFormat = 'json' | 'ndjson';

/** The `format` query parameter: json unless given. */
export function parseExportFormat(raw: unknown): ExportFormat {
  const format = raw ?? 'json';
  if (format !== 'json' && format !== 'ndjson') throw badRequest('format', 'must be json or ndjson');
  return format;
}

function withoutRuns(scenario: ScenarioResult): Omit<ScenarioResult, 'runs'> {
  const { runs: _runs, ...rest } = scenario;
  return rest;
}

export type ExportLine =
  | ({ type: 'experiment' } & ExperimentDetail)
  | { type: 'spec'; id: string; version: number; yaml: string | null }
  | ({ type: 'scenario' } & Omit<ScenarioResult, 'runs'>)
  | ({ type: 'run' } & RunLine)
  | { type: 'end'; scenarios: number; runs: number };

/** A run's line: its result, the runner's outcome, and its sandbox's audit records, a page at a time (rendered by runText). */
type RunLine = RunResult & { outcome: unknown; audit: AsyncIterable<AuditItem[]> };

/** The audit records of a run's sandbox (none when the run never got one). */
async function* runAudit(store: Store, tenant: string, sandboxId: string | null): AsyncGenerator<AuditItem[]> {
  if (sandboxId !== null) yield* allAuditRecords(store, { tenant, sandboxId }, AUDIT_PAGE);
}

/** Scenario and run lines in index order, counted; planned scenarios without any scored run come in their place, with no runs. */
class ScenarioLines {
  private nextIndex = 0;
  /** The index of the next scenario to emit. */
  get next(): number {
    return this.nextIndex;
  }

  scenarios = 0;
  runs = 0;

  constructor(
    private readonly store: Store,
    private readonly ctx: ResultContext,
    private readonly traces: ReadonlyMap<string, RunTraceStats>,
    private readonly planned: number,
  ) {}

  /** The lines of scenario `index` with its run rows (and of the planned ones before it); `planned`, [] ends the bundle's scenarios. */
  *emit(index: number, rows: RunRow[]): Generator<ExportLine> {
    for (; this.nextIndex < Math.min(index, this.planned); this.nextIndex++) {
      this.scenarios++;
      yield { type: 'scenario', ...withoutRuns(scenarioResult(this.ctx, this.nextIndex, [], this.traces)) };
    }
    if (index >= this.planned && rows.length === 0) return;
    const scenario = scenarioResult(this.ctx, index, rows, this.traces);
    this.scenarios++;
    yield { type: 'scenario', ...withoutRuns(scenario) };
    for (const [i, run] of scenario.runs.entries()) {
      this.runs++;
      yield { type: 'run', ...run, outcome: JSON.parse(rows[i].Outcome!), audit: runAudit(this.store, this.ctx.experiment.tenant, run.sandbox_id) };
    }
    this.nextIndex = index + 1;
  }
}

/** One page of run rows with their outcomes after `after`, in (scenario, replica, run) order. */
function runPage(store: Store, tenant: string, experimentId: string, after: [number, number, string] | null): Promise<RunRow[]> {
  return store.query<RunRow>(
    `SELECT ${RUN_COLUMNS}, Outcome FROM run_scores FINAL
     WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}
       ${after ? 'AND (ScenarioIndex, Replica, RunId) > ({after_index:UInt32}, {after_replica:UInt32}, {after_run:String})' : ''}
     ORDER BY ScenarioIndex, Replica, RunId LIMIT {page:UInt32}`,
    { tenant, experiment: experimentId, page: EXPORT_PAGE, ...(after ? { after_index: after[0], after_replica: after[1], after_run: after[2] } : {}) },
  );
}

/** Every run row of the experiment, read a page at a time, given out a scenario at a time. */
async function* runsByScenario(store: Store, tenant: string, experimentId: string): AsyncGenerator<RunRow[]> {
  let group: RunRow[] = [];
  let after: [number, number, string] | null = null;
  for (;;) {
    const page = await runPage(store, tenant, experimentId, after);
    for (const row of page) {
      if (group.length > 0 && Number(group[0].ScenarioIndex) !== Number(row.ScenarioIndex)) {
        yield group;
        group = [];
      }
      group.push(row);
    }
    if (page.length < EXPORT_PAGE) break;
    const last = page[page.length - 1];
    after = [Number(last.ScenarioIndex), Number(last.Replica), last.RunId];
  }
  if (group.length > 0) yield group;
}

/** The export bundle as a stream of typed lines, ending with `end` and the totals. */
async function* exportLines(kernel: Kernel, experiment: ExperimentChanged, plan: PinnedPlan): AsyncGenerator<ExportLine> {
  const { store, config } = kernel;
  const { tenant, experiment_id: id } = experiment;
  // Every audit record on the log now (the runs' included) is in the table before it is read.
  const [facts, traces] = await Promise.all([runFacts(store, tenant, id), runTraceStats(store, tenant, id), auditStored(kernel, null)]);
  const metrics = computeMetrics(id, facts, traces, plan.scoring.replica_aggregation);
  yield { type: 'experiment', ...experimentDetail(experiment, plan, metrics) };
  yield { type: 'spec', id: experiment.spec_id, version: experiment.spec_version, yaml: plan.yaml };
  const planned = plan.scenarios ?? 0;
  // Over a dataset, the scenarios' params are read in index order beside the runs.
  const window = plan.dataset ? new ScenarioParamsWindow(store, tenant, id, planned) : null;
  const lines = new ScenarioLines(store, { experiment, plan, baseUrl: config.baseUrl, scenarioParams: window?.params }, traces, planned);
  for await (const rows of runsByScenario(store, tenant, id)) {
    await window?.upTo(Number(rows[0].ScenarioIndex), lines.next);
    yield* lines.emit(Number(rows[0].ScenarioIndex), rows);
  }
  await window?.upTo(planned, lines.next);
  yield* lines.emit(planned, []);
  yield { type: 'end', scenarios: lines.scenarios, runs: lines.runs };
}

/** The same lines as one JSON document `{experiment, spec, scenarios: [{..., runs: [...]}], totals}`, in chunks. */
async function* exportJson(lines: AsyncIterable<ExportLine>): AsyncGenerator<string> {
  let openScenario = false;
  let firstScenario = true;
  let firstRun = true;
  for await (const line of lines) {
    const { type, ...rest } = line;
    switch (type) {
      case 'experiment':
        yield `{"experiment":${JSON.stringify(rest)}`;
        break;
      case 'spec':
        yield `,"spec":${JSON.stringify(rest)},"scenarios":[`;
        break;
      case 'scenario': {
        const opening = JSON.stringify({ ...rest, runs: [] });
        // Drop the closing `]}` of the empty runs list: the runs follow.
        yield `${openScenario ? ']}' : ''}${firstScenario ? '' : ','}${opening.slice(0, -2)}`;
        openScenario = true;
        firstScenario = false;
        firstRun = true;
        break;
      }
      case 'run':
        if (!firstRun) yield ',';
        yield* runText(rest as RunLine);
        firstRun = false;
        break;
      case 'end':
        yield `${openScenario ? ']}' : ''}],"totals":${JSON.stringify(rest)}}`;
        break;
    }
  }
}

async function* ndjson(lines: AsyncIterable<ExportLine>): AsyncGenerator<string> {
  for await (const line of lines) {
    if (line.type === 'run') yield* runText(line);
    else yield JSON.stringify(line);
    yield '\n';
  }
}

/**
 * A run line as JSON text, `{..., "outcome": {...}, "audit": [...]}`, its audit records written
 * a page at a time as they are read (a run's audit log is bounded by SVC_AUDIT_MAX_RECORDS).
 */
async function* runText(run: RunLine | ({ type: 'run' } & RunLine)): AsyncGenerator<string> {
  const { audit, ...rest } = run;
  // Drop the closing `]}` of the empty list: the records follow.
  yield JSON.stringify({ ...rest, audit: [] }).slice(0, -2);
  let first = true;
  for await (const page of audit) {
    yield `${first ? '' : ','}${page.map((record) => JSON.stringify(record)).join(',')}`;
    first = false;
  }
  yield ']}';
}

/**
 * The bundle as a download: its content type, file name and body. The first chunk is read
 * before answering, so a failing query is an error status, not a cut stream.
 */
export async function exportDownload(
  kernel: Kernel,
  experiment: ExperimentChanged,
  plan: PinnedPlan,
  format: ExportFormat,
): Promise<{ type: string; filename: string; body: Readable }> {
  const lines = exportLines(kernel, experiment, plan);
  const chunks = format === 'json' ? exportJson(lines) : ndjson(lines);
  const first = await chunks.next();
  const body = Readable.from(
    (async function* () {
      if (!first.done) yield first.value;
      yield* chunks;
    })(),
  );
  return { type: format === 'json' ? 'application/json' : 'application/x-ndjson', filename: `${experiment.experiment_id}.${format}`, body };
}
