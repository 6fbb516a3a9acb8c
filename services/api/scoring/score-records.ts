/**
 * The score records of an experiment (GET /v1/experiments/:id/scores, GET /v1/scores), read from
 * ClickHouse (`scores`, latest per rule and run): a page at a time in (rule, scenario, replica,
 * run) order, or every one as NDJSON. docs/scoring.md documents the record.
 */
import type { Readable } from 'node:stream';
import type { ExperimentChanged } from '../../domain/events/experiment-events.ts';
import type { Config } from '../../kernel/config.ts';
import { badRequest } from '../../kernel/errors.ts';
import type { Store } from '../../kernel/store/store.ts';
import { decodeCursor, encodeCursor, ndjsonStream, parseLimit } from '../pagination.ts';

interface ScoreRow {
  RuleId: string;
  RunId: string;
  ScenarioId: string;
  ScenarioIndex: number;
  Replica: number;
  RuleName: string;
  RuleType: string;
  RequestId: string;
  Graded: number;
  Score: number;
  Passed: number;
  JudgeFailure: number;
  Reason: string;
  Details: string;
  Error: string;
  scored_ms: string;
}

export interface ScoreQuery {
  /** Only this rule's records, when given. */
  ruleId: string | null;
  cursor: string[] | null;
  limit: number;
  /** The limit when the caller gave one: an NDJSON answer streams every record otherwise. */
  max: number | null;
}

function scoreCursor(raw: unknown): string[] | null {
  const key = decodeCursor(raw, 4);
  if (key && (!/^\d+$/.test(key[1]!) || !/^\d+$/.test(key[2]!))) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  return key;
}

/** The query parameters rule_id, limit and cursor, checked in that order. */
export function parseScoreQuery(q: Record<string, unknown>, config: Config): ScoreQuery {
  const ruleId = q.rule_id as string | undefined;
  if (ruleId === '') throw badRequest('rule_id', 'must not be empty');
  const limit = parseLimit(q.limit, config);
  return { ruleId: ruleId ?? null, cursor: scoreCursor(q.cursor), limit, max: q.limit === undefined ? null : limit };
}

function scoreRecord(experimentId: string, r: ScoreRow) {
  return {
    experiment_id: experimentId,
    rule_id: r.RuleId,
    rule_name: r.RuleName,
    rule_type: r.RuleType,
    run_id: r.RunId,
    scenario_id: r.ScenarioId,
    replica: Number(r.Replica),
    score: r.Graded === 1 ? r.Score : null,
    passed: r.Graded === 1 ? r.Passed === 1 : null,
    judge_failure: r.JudgeFailure === 1,
    reason: r.Reason,
    details: JSON.parse(r.Details) as unknown,
    error: r.Error === '' ? null : r.Error,
    request_id: r.RequestId,
    scored_at: new Date(Number(r.scored_ms)).toISOString(),
  };
}

/** One page of an experiment's score records in (rule, scenario, replica, run) order, and the cursor after it. */
async function scorePage(store: Store, experiment: ExperimentChanged, ruleId: string | null, after: string[] | null, limit: number) {
  const rows = await store.query<ScoreRow>(
    `SELECT RuleId, RunId, ScenarioId, ScenarioIndex, Replica, RuleName, RuleType, RequestId, Graded, Score, Passed, JudgeFailure, Reason, Details, Error,
            toUnixTimestamp64Milli(ScoredAt) AS scored_ms
     FROM scores FINAL
     WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}
       ${ruleId === null ? '' : 'AND RuleId = {rule:String}'}
       ${after === null ? '' : 'AND (RuleId, ScenarioIndex, Replica, RunId) > ({after_rule:String}, {after_index:UInt32}, {after_replica:UInt32}, {after_run:String})'}
     ORDER BY RuleId, ScenarioIndex, Replica, RunId
     LIMIT {limit:UInt32}`,
    {
      tenant: experiment.tenant,
      experiment: experiment.experiment_id,
      limit: limit + 1,
      ...(ruleId === null ? {} : { rule: ruleId }),
      ...(after === null ? {} : { after_rule: after[0], after_index: Number(after[1]), after_replica: Number(after[2]), after_run: after[3] }),
    },
  );
  const items = rows.slice(0, limit).map((r) => scoreRecord(experiment.experiment_id, r));
  const last = rows.length > limit ? rows[limit - 1]! : null;
  return { items, next: last ? encodeCursor([last.RuleId, String(last.ScenarioIndex), String(last.Replica), last.RunId]) : null };
}

/** The page the query asks for. */
export function scoreRecords(store: Store, experiment: ExperimentChanged, query: ScoreQuery) {
  return scorePage(store, experiment, query.ruleId, query.cursor, query.limit);
}

/** Every record from the query's cursor on (up to its limit when given) as NDJSON, read `pageSize` at a time. */
export function scoreStream(store: Store, experiment: ExperimentChanged, query: ScoreQuery, pageSize: number): Readable {
  let first = true;
  return ndjsonStream((next) => {
    const after = first ? query.cursor : scoreCursor(next ?? undefined);
    first = false;
    return scorePage(store, experiment, query.ruleId, after, pageSize);
  }, query.max);
}
