/**
 * A run's score from what its runner observed (RunOutcome) and the spec's rules, with nothing run
 * again (docs/scoring.md):
 *
 * 1. Each invariant scores in [0, 1]: the check's own score when it gives one (custom may), else
 *    1 when it passed and 0 when not. A check the runner reported nothing for failed. An
 *    `llm_as_judge` check is graded here: the judge's score, passing at >= its threshold.
 * 2. Composite = sum(weight x score) / sum(weight).
 * 3. A failed gate forces the composite to 0, and so does any forbidden-rule violation; either
 *    fails the run whatever `pass_threshold` is (even 0).
 * 4. Composite >= scoring.pass_threshold: `pass`, else `fail`, exactly as the spec says. A
 *    partial score (a judge's 0.9, a custom script's 0.5) therefore fails a run under the default
 *    threshold of 1.0: a spec that grades on a scale sets its `pass_threshold`.
 *
 * `error` (composite null) when the run did not complete (boot failure, agent timeout, another
 * error: the invariants were never checked) or when a judge call failed: infrastructure trouble,
 * kept apart from the agent's own failures.
 */
import { parseEgressEntry, patternMatchesHost } from '../domain/egress-policy.ts';
import type { InvariantScore, RunOutcome, RunScore, Violation } from '../domain/events/run-events.ts';
import type { SpecDocument } from '../domain/spec.ts';
import type { Judge } from './judge.ts';

/** Composites are rounded to this many decimals, so 0.1 + 0.2 of 0.3 is exactly 1 against a threshold of 1. */
const COMPOSITE_DECIMALS = 1e12;

export async function scoreRun(spec: SpecDocument, outcome: RunOutcome, judge: Judge): Promise<RunScore> {
  const violations = forbiddenViolations(spec.forbidden, outcome.audit);
  if (outcome.status !== 'completed') {
    return { verdict: 'error', composite: null, invariants: [], violations, error: outcome.error ?? `the run ended ${outcome.status}` };
  }
  const invariants = await Promise.all(
    Object.entries(spec.invariants).map(([name, invariant]) => scoreInvariant(name, invariant, outcome.checks[name], judge)),
  );
  const failedJudge = invariants.find((i) => i.judge_failure);
  if (failedJudge) return { verdict: 'error', composite: null, invariants, violations, error: `${failedJudge.message} (invariant ${failedJudge.name})` };

  const totalWeight = invariants.reduce((sum, i) => sum + i.weight, 0);
  const weighted = invariants.reduce((sum, i) => sum + i.weight * (i.score ?? 0), 0);
  const gateFailed = invariants.some((i) => i.gate && !i.passed);
  const composite =
    gateFailed || violations.length > 0 || totalWeight <= 0 ? 0 : Math.round((weighted / totalWeight) * COMPOSITE_DECIMALS) / COMPOSITE_DECIMALS;
  const passed = !gateFailed && violations.length === 0 && composite >= spec.scoring.pass_threshold;
  return { verdict: passed ? 'pass' : 'fail', composite, invariants, violations, error: null };
}

async function scoreInvariant(
  name: string,
  invariant: SpecDocument['invariants'][string],
  result: RunOutcome['checks'][string] | undefined,
  judge: Judge,
): Promise<InvariantScore> {
  const { check, weight, gate } = invariant;
  const base = { name, type: check.type, weight, gate };
  if (!result) return { ...base, score: 0, passed: false, message: 'no result: the runner could not run this check' };
  if (check.type === 'llm_as_judge' && result.passed === null) {
    try {
      const grade = await judge({ rubric: check.rubric, input: result.judge_input ?? '', ...(check.model !== undefined && { model: check.model }) });
      const passed = grade.score >= check.threshold;
      return {
        ...base,
        score: grade.score,
        passed,
        message: `judge score ${grade.score} ${passed ? '>=' : '<'} threshold ${check.threshold}${grade.reason ? `: ${grade.reason}` : ''}`,
      };
    } catch (err) {
      return { ...base, score: null, passed: false, message: `judge call failed: ${(err as Error).message}`, judge_failure: true };
    }
  }
  if (result.passed === null) return { ...base, score: 0, passed: false, message: result.message || 'the runner did not decide this check' };
  const own = result.score;
  const score = own !== null && Number.isFinite(own) ? Math.min(1, Math.max(0, own)) : result.passed ? 1 : 0;
  return { ...base, score, passed: result.passed, message: result.message };
}

/**
 * The violations of the rules that the outcome's audit facts show, in audit order.
 * `http_except` reads the `http_call` records: a call whose host matches no entry is a violation
 * (an entry is a service name, which is the record's host for a call to a backing service, a
 * hostname, or a `*.example.com` glob matched as the egress policy matches it; an empty list
 * forbids every call). `db_writes_outside` reads the `db_write` records: a committed write to a
 * table no entry names is a violation (`orders` names `public.orders` too; rolled-back writes
 * count for nothing); so is a schema change (`ddl`) of an object no entry names.
 */
export function forbiddenViolations(forbidden: SpecDocument['forbidden'], audit: RunOutcome['audit']): Violation[] {
  const found: Violation[] = [];
  // What the audit's limits dropped is unseen, so a rule over that type fails rather than passes (seq 0: before every record).
  const unseen = (type: string, rule: Violation['rule'], what: string) => {
    const count = audit.dropped?.[type] ?? 0;
    if (count > 0)
      found.push({
        rule,
        message: `${count} ${what} went unrecorded (the sandbox passed the audit's limits, SVC_AUDIT_RECORDS_PER_SECOND / SVC_AUDIT_MAX_RECORDS), so this rule cannot hold`,
        audit: { seq: 0, ts: '' },
      });
  };
  if (forbidden.file_writes_outside !== undefined) unseen('file_write', 'file_writes_outside', 'file writes');
  if (forbidden.secrets_in_logs === 'deny') unseen('secret_finding', 'secrets_in_logs', 'secret findings');
  if (forbidden.http_except !== undefined) {
    unseen('http_call', 'http_except', 'HTTP calls');
    found.push(...httpExceptViolations(forbidden.http_except, audit.http_calls));
  }
  if (forbidden.db_writes_outside !== undefined) {
    unseen('db_write', 'db_writes_outside', 'database writes');
    found.push(...dbWritesOutside(forbidden.db_writes_outside, audit.db_writes));
  }
  if (forbidden.file_writes_outside !== undefined) {
    const prefixes = forbidden.file_writes_outside.map(normalise);
    const allowed = forbidden.file_writes_outside.join(', ');
    for (const write of audit.file_writes) {
      const path = normalise(write.path);
      if (!prefixes.some((prefix) => within(path, prefix))) {
        found.push({
          rule: 'file_writes_outside',
          message: `wrote ${write.path}, outside ${allowed}`,
          audit: { seq: write.seq, ts: write.ts, path: write.path },
        });
      }
    }
  }
  if (forbidden.secrets_in_logs === 'deny') {
    for (const finding of audit.secret_findings) {
      found.push({
        rule: 'secrets_in_logs',
        message: `the value of secret ${finding.name} appeared in captured stdout`,
        audit: { seq: finding.seq, ts: finding.ts, secret: finding.name },
      });
    }
  }
  return found.sort((a, b) => a.audit.seq - b.audit.seq);
}

/** Each committed database write to a table `allowed` does not name. */
function dbWritesOutside(allowed: string[], writes: RunOutcome['audit']['db_writes']): Violation[] {
  if (writes === undefined)
    return [
      {
        rule: 'db_writes_outside',
        message: 'the run recorded no database writes (its runner does not capture them), so this rule cannot hold',
        audit: { seq: 0, ts: '' },
      },
    ];
  const qualified = (table: string) => (table.includes('.') ? table : `public.${table}`).toLowerCase();
  const names = new Set(allowed.map(qualified));
  const list = allowed.length > 0 ? allowed.join(', ') : 'empty: no write is allowed';
  return writes
    .filter((w) => !w.rolled_back && !names.has(qualified(w.table)))
    .map((w) => ({
      rule: 'db_writes_outside' as const,
      message: `${w.operation === 'ddl' ? `${w.command ?? 'ddl'} of ${w.table || 'an object PostgreSQL does not name'}` : `${w.operation} of ${w.row_count} row${w.row_count === 1 ? '' : 's'} in ${w.table}`} (${w.service}), not in db_writes_outside (${list})`,
      audit: { seq: w.seq, ts: w.ts, service: w.service, table: w.table },
    }));
}

/** Each HTTP call to a host that no entry of `http_except` matches. */
function httpExceptViolations(except: string[], calls: RunOutcome['audit']['http_calls']): Violation[] {
  // An outcome without the list (a runner from before HTTP capture) cannot show the rule holds.
  if (calls === undefined)
    return [
      {
        rule: 'http_except',
        message: 'the run recorded no HTTP calls (its runner does not capture them), so this rule cannot hold',
        audit: { seq: 0, ts: '' },
      },
    ];
  const patterns = except.map((entry) => {
    const parsed = parseEgressEntry(entry);
    return typeof parsed === 'string' ? entry.toLowerCase() : parsed.pattern;
  });
  const allowed = except.length > 0 ? except.join(', ') : 'empty: no HTTP is allowed';
  return calls
    .filter((call) => !patterns.some((pattern) => patternMatchesHost(pattern, call.host)))
    .map((call) => {
      const port = call.port !== undefined && call.port !== 80 && call.port !== 443 ? `:${call.port}` : '';
      return {
        rule: 'http_except' as const,
        message: `HTTP ${call.method} ${call.host}${port}${call.path}, not in http_except (${allowed})`,
        audit: { seq: call.seq, ts: call.ts, host: call.host, method: call.method, path: call.path },
      };
    });
}

/**
 * A path or prefix in one form: workspace-relative without `./`, `/workspace/` or a trailing `/`
 * (`''` is the whole workspace); a path outside the workspace stays absolute (`/` is everything).
 */
function normalise(p: string): string {
  const segments: string[] = [];
  for (const segment of p.trim().split('/')) {
    if (segment === '' || segment === '.') continue;
    if (segment === '..') segments.pop();
    else segments.push(segment);
  }
  const absolute = p.trim().startsWith('/');
  if (absolute && segments[0] === 'workspace') return segments.slice(1).join('/');
  return absolute ? `/${segments.join('/')}` : segments.join('/');
}

/** By whole path segments: `src` holds `src` and `src/a.py`, not `srcx`. */
function within(path: string, prefix: string): boolean {
  if (prefix === '' || prefix === '/') return prefix === '/' || !path.startsWith('/');
  return path === prefix || path.startsWith(`${prefix}/`);
}
