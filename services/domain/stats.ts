/**
 * The statistics of experiments, pure and dependency-free (docs/experiments.md explains how each
 * is used): Wilson intervals, the unbiased pass@k and pass^k estimators, replica aggregation and
 * scenario verdicts, the Cochran–Mantel–Haenszel test and Welch's t-test with their p-values.
 *
 * The distribution functions (log-gamma, regularized incomplete gamma and beta) follow the
 * classic Lanczos / series / Lentz continued-fraction formulations; they are accurate to about
 * 1e-12, far beyond what a 0.05 significance level needs.
 */

/** z of a two-sided 95% interval. */
const Z_95 = 1.959963984540054;

export interface Interval {
  low: number;
  high: number;
}

/** The Wilson score interval of `successes` out of `n` (null for n = 0: nothing observed). */
export function wilsonInterval(successes: number, n: number, z = Z_95): Interval | null {
  if (n === 0) return null;
  const p = successes / n;
  const z2 = z * z;
  const denominator = 1 + z2 / n;
  const centre = (p + z2 / (2 * n)) / denominator;
  const half = (z / denominator) * Math.sqrt((p * (1 - p)) / n + z2 / (4 * n * n));
  return { low: Math.max(0, centre - half), high: Math.min(1, centre + half) };
}

/**
 * pass@k: the chance that at least one of k runs drawn without replacement from n runs, c of
 * which passed, passes; 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), as a product so that large n
 * does not overflow. Null when n = 0.
 */
export function passAtK(n: number, c: number, k: number): number | null {
  checkK(n, c, k);
  if (n === 0) return null;
  if (n - c < k) return 1;
  let allFail = 1;
  for (let i = n - c + 1; i <= n; i++) allFail *= 1 - k / i;
  return 1 - allFail;
}

/** pass^k: the chance that all of k runs drawn without replacement pass; C(c, k) / C(n, k). Null when n = 0. */
export function passHatK(n: number, c: number, k: number): number | null {
  checkK(n, c, k);
  if (n === 0) return null;
  if (c < k) return 0;
  let allPass = 1;
  for (let i = 0; i < k; i++) allPass *= (c - i) / (n - i);
  return allPass;
}

function checkK(n: number, c: number, k: number): void {
  if (!(Number.isInteger(n) && Number.isInteger(c) && Number.isInteger(k) && n >= 0 && c >= 0 && c <= n && k >= 1 && (n === 0 || k <= n))) {
    throw new RangeError(`pass@k needs integers 0 <= c <= n and 1 <= k <= n (got n=${n}, c=${c}, k=${k})`);
  }
}

export type ScenarioVerdict = 'pass' | 'fail' | 'flaky' | 'error';

/**
 * A scenario's verdict over its completed runs (errored runs are kept apart): all passed: pass;
 * all failed: fail; both: flaky; no completed run: error.
 */
export function scenarioVerdict(passed: number, failed: number): ScenarioVerdict {
  if (passed + failed === 0) return 'error';
  if (failed === 0) return 'pass';
  if (passed === 0) return 'fail';
  return 'flaky';
}

export interface ReplicaAggregation {
  strategy: 'majority' | 'all_must_pass' | 'percentage';
  /** Required by `percentage` (the spec refuses it without one). */
  min_pass_rate?: number;
}

/**
 * Whether a scenario counts as passing in the experiment's pass rate, from its completed runs:
 * `majority` more than half passed, `all_must_pass` every one, `percentage` at least
 * min_pass_rate of them. A scenario without a completed run never counts as passing.
 */
export function countsAsPassing(aggregation: ReplicaAggregation, passed: number, completed: number): boolean {
  if (completed === 0) return false;
  switch (aggregation.strategy) {
    case 'majority':
      return passed * 2 > completed;
    case 'all_must_pass':
      return passed === completed;
    case 'percentage':
      // The tolerance keeps 7 of 10 passing at min_pass_rate 0.7 despite binary fractions.
      return passed >= (aggregation.min_pass_rate ?? 1) * completed - 1e-9;
  }
}

// --- distributions --------------------------------------------------------------------------

const LANCZOS = [
  0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059, 12.507343278686905, -0.13857109526572012,
  9.9843695780195716e-6, 1.5056327351493116e-7,
];

/** ln Γ(x) for x > 0 (Lanczos, g = 7). */
export function logGamma(x: number): number {
  if (x < 0.5) return Math.log(Math.PI / Math.abs(Math.sin(Math.PI * x))) - logGamma(1 - x);
  const z = x - 1;
  let sum = LANCZOS[0];
  for (let i = 1; i < LANCZOS.length; i++) sum += LANCZOS[i] / (z + i);
  const t = z + 7.5;
  return 0.5 * Math.log(2 * Math.PI) + (z + 0.5) * Math.log(t) - t + Math.log(sum);
}

const EPSILON = 1e-15;
const TINY = 1e-300;
const MAX_ITERATIONS = 10_000;

/** Q(a, x) = Γ(a, x) / Γ(a), the upper regularized incomplete gamma function. */
export function regularizedGammaQ(a: number, x: number): number {
  if (x <= 0) return 1;
  const prefix = Math.exp(-x + a * Math.log(x) - logGamma(a));
  if (x < a + 1) {
    // Series for P(a, x), then Q = 1 - P.
    let term = 1 / a;
    let sum = term;
    for (let n = 1; n < MAX_ITERATIONS && Math.abs(term) > Math.abs(sum) * EPSILON; n++) {
      term *= x / (a + n);
      sum += term;
    }
    return Math.max(0, 1 - sum * prefix);
  }
  // Continued fraction for Q (modified Lentz).
  let b = x + 1 - a;
  let c = 1 / TINY;
  let d = 1 / b;
  let h = d;
  for (let i = 1; i < MAX_ITERATIONS; i++) {
    const an = -i * (i - a);
    b += 2;
    d = an * d + b;
    if (Math.abs(d) < TINY) d = TINY;
    c = b + an / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    const delta = d * c;
    h *= delta;
    if (Math.abs(delta - 1) < EPSILON) break;
  }
  return Math.min(1, prefix * h);
}

/** I_x(a, b), the regularized incomplete beta function. */
export function regularizedBeta(x: number, a: number, b: number): number {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const front = Math.exp(logGamma(a + b) - logGamma(a) - logGamma(b) + a * Math.log(x) + b * Math.log(1 - x));
  // The continued fraction converges fast only below (a + 1) / (a + b + 2); use the symmetry above it.
  if (x > (a + 1) / (a + b + 2)) return 1 - (front * betaFraction(1 - x, b, a)) / b;
  return (front * betaFraction(x, a, b)) / a;
}

function betaFraction(x: number, a: number, b: number): number {
  let c = 1;
  let d = 1 - ((a + b) * x) / (a + 1);
  if (Math.abs(d) < TINY) d = TINY;
  d = 1 / d;
  let h = d;
  for (let m = 1; m < MAX_ITERATIONS; m++) {
    const m2 = 2 * m;
    let an = (m * (b - m) * x) / ((a + m2 - 1) * (a + m2));
    d = 1 + an * d;
    if (Math.abs(d) < TINY) d = TINY;
    c = 1 + an / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    h *= d * c;
    an = (-(a + m) * (a + b + m) * x) / ((a + m2) * (a + m2 + 1));
    d = 1 + an * d;
    if (Math.abs(d) < TINY) d = TINY;
    c = 1 + an / c;
    if (Math.abs(c) < TINY) c = TINY;
    d = 1 / d;
    const delta = d * c;
    h *= delta;
    if (Math.abs(delta - 1) < EPSILON) break;
  }
  return h;
}

/** P(X >= x) for X chi-squared with `df` degrees of freedom. */
export function chiSquaredSurvival(x: number, df: number): number {
  return regularizedGammaQ(df / 2, x / 2);
}

/** P(|T| >= |t|) for T Student-t with `df` degrees of freedom (df may be fractional). */
export function studentTTwoSided(t: number, df: number): number {
  if (!Number.isFinite(t)) return 0;
  return regularizedBeta(df / (df + t * t), df / 2, 0.5);
}

// --- tests ----------------------------------------------------------------------------------

/**
 * One stratum: group 1 had `a` successes and `b` failures, group 2 `c` successes and `d`
 * failures.
 */
export interface Table2x2 {
  a: number;
  b: number;
  c: number;
  d: number;
}

export interface CmhResult {
  /** The Mantel–Haenszel chi-squared statistic (1 degree of freedom). */
  statistic: number;
  p_value: number;
  /**
   * Σ (a − E[a]) over the strata: > 0 when group 1 had more successes than independence
   * predicts (group 2 did worse), < 0 when fewer.
   */
  excess: number;
  /** The Mantel–Haenszel common odds ratio (group 1 vs 2); null when undefined (0/0). */
  odds_ratio: number | null;
}

/**
 * The Cochran–Mantel–Haenszel test of conditional independence over 2x2 strata, with the
 * continuity correction (as R's mantelhaen.test with correct = TRUE). Strata of fewer than two
 * observations carry no information and drop out; with no variance left, p is 1.
 */
export function cochranMantelHaenszel(strata: readonly Table2x2[], options: { continuity?: boolean } = {}): CmhResult {
  let excess = 0;
  let variance = 0;
  let orNumerator = 0;
  let orDenominator = 0;
  for (const { a, b, c, d } of strata) {
    const n = a + b + c + d;
    if (n < 2) continue;
    const row1 = a + b;
    const row2 = c + d;
    const col1 = a + c;
    const col2 = b + d;
    excess += a - (row1 * col1) / n;
    variance += (row1 * row2 * col1 * col2) / (n * n * (n - 1));
    orNumerator += (a * d) / n;
    orDenominator += (b * c) / n;
  }
  const oddsRatio = orDenominator === 0 ? (orNumerator === 0 ? null : Infinity) : orNumerator / orDenominator;
  if (variance === 0) return { statistic: 0, p_value: 1, excess, odds_ratio: oddsRatio };
  const correction = options.continuity !== false && Math.abs(excess) >= 0.5 ? 0.5 : 0;
  const statistic = (Math.abs(excess) - correction) ** 2 / variance;
  return { statistic, p_value: chiSquaredSurvival(statistic, 1), excess, odds_ratio: oddsRatio };
}

export interface WelchResult {
  t: number;
  df: number;
  p_value: number;
  mean_a: number;
  mean_b: number;
}

export function mean(values: readonly number[]): number {
  return values.reduce((sum, v) => sum + v, 0) / values.length;
}

function sampleVariance(values: readonly number[], m: number): number {
  return values.reduce((sum, v) => sum + (v - m) ** 2, 0) / (values.length - 1);
}

/**
 * Welch's unequal-variances t-test of the means of `a` and `b`, two-sided; t > 0 when a's mean
 * is larger. Null when either sample has fewer than two values. Two constant samples are equal
 * (p 1) or certainly different (p 0).
 */
export function welchTTest(a: readonly number[], b: readonly number[]): WelchResult | null {
  if (a.length < 2 || b.length < 2) return null;
  const meanA = mean(a);
  const meanB = mean(b);
  const va = sampleVariance(a, meanA) / a.length;
  const vb = sampleVariance(b, meanB) / b.length;
  const se2 = va + vb;
  if (se2 === 0) {
    const t = meanA === meanB ? 0 : meanA > meanB ? Infinity : -Infinity;
    return { t, df: a.length + b.length - 2, p_value: meanA === meanB ? 1 : 0, mean_a: meanA, mean_b: meanB };
  }
  const t = (meanA - meanB) / Math.sqrt(se2);
  const df = se2 ** 2 / (va ** 2 / (a.length - 1) + vb ** 2 / (b.length - 1));
  return { t, df, p_value: studentTTwoSided(t, df), mean_a: meanA, mean_b: meanB };
}

/** The q-quantile by linear interpolation between the closest ranks (numpy's default); null when empty. */
export function quantile(values: readonly number[], q: number): number | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((x, y) => x - y);
  const position = (sorted.length - 1) * q;
  const lower = Math.floor(position);
  const upper = Math.ceil(position);
  return sorted[lower] + (sorted[upper] - sorted[lower]) * (position - lower);
}
