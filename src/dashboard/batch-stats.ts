// The numbers of a batch page that the summary does not have: reward and per-metric histogram bins, phase timing
// percentiles, reward and pass@k by task, and the timeline of episodes finishing. Pure functions of
// the results' outlines.
import { passAtK } from '../results/batch-summary.ts';
import { passes } from '../tasks/batch-spec.ts';
import type { ResultOutline } from '../results/result-outline.ts';

export const PHASES = ['setup', 'agent', 'verify', 'close'] as const;
export type Phase = (typeof PHASES)[number];

export interface HistogramBin {
  label: string;
  /** Lower bound (inclusive) and upper bound (exclusive; inclusive for the last bin). */
  from: number;
  to: number;
  count: number;
}

/**
 * Values in `binCount` equal bins over [0, 1], widened to the lowest and highest value when one lies
 * outside it (a reward file's reward may be any float: it is shown where it is, never clamped).
 */
export function valueHistogram(values: readonly number[], binCount = 10): HistogramBin[] {
  let lo = 0;
  let hi = 1;
  for (const v of values) {
    if (v < lo) lo = v;
    if (v > hi) hi = v;
  }
  const width = (hi - lo) / binCount;
  // As many decimals as the bin width needs: 0.0-0.1 over [0, 1], 0-2 over [0, 20].
  const digits = Math.min(4, Math.max(0, Math.ceil(-Math.log10(width) - 1e-9)));
  const bins: HistogramBin[] = Array.from({ length: binCount }, (_, i) => {
    const from = lo + i * width;
    const to = i === binCount - 1 ? hi : lo + (i + 1) * width;
    return { label: `${from.toFixed(digits)}-${to.toFixed(digits)}`, from, to, count: 0 };
  });
  // Scaled by the whole span, not divided by the width: 0.3 over [0, 1] is bin 3, not 2.9999.
  for (const v of values) bins[Math.min(binCount - 1, Math.floor(((v - lo) / (hi - lo)) * binCount))]!.count += 1;
  return bins;
}

/** Rewards of graded episodes binned (see valueHistogram); ungraded ones are counted apart. */
export function rewardHistogram(results: readonly ResultOutline[], binCount = 10): { bins: HistogramBin[]; ungraded: number } {
  const rewards: number[] = [];
  let ungraded = 0;
  for (const r of results) {
    if (r.reward === null) ungraded += 1;
    else rewards.push(r.reward);
  }
  return { bins: valueHistogram(rewards, binCount), ungraded };
}

/** A histogram of one reward-file metric over the episodes that reported it. */
export interface MetricHistogram {
  metric: string;
  /** Episodes that reported the metric. */
  n: number;
  bins: HistogramBin[];
}

/** The first `maxMetrics` reward-file metrics (reward.json's keys) by name, each binned over the episodes that reported it. */
export function metricHistograms(results: readonly ResultOutline[], binCount = 10, maxMetrics = 12): MetricHistogram[] {
  const byMetric = new Map<string, number[]>();
  for (const r of results) {
    for (const [key, value] of Object.entries(r.metrics ?? {})) {
      let values = byMetric.get(key);
      if (values === undefined) byMetric.set(key, (values = []));
      values.push(value);
    }
  }
  return [...byMetric.keys()].sort().slice(0, maxMetrics).map((metric) => {
    const values = byMetric.get(metric)!;
    return { metric, n: values.length, bins: valueHistogram(values, binCount) };
  });
}

/** Nearest-rank percentile (p in 0..100) of unsorted values; undefined for none. */
export function percentile(values: readonly number[], p: number): number | undefined {
  return sortedPercentile(Float64Array.from(values).sort(), p);
}

/** The same of values sorted ascending (a typed array sorts without a comparator call: 5x faster). */
function sortedPercentile(sorted: Float64Array, p: number): number | undefined {
  if (sorted.length === 0) return undefined;
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[Math.min(sorted.length, rank) - 1];
}

export interface PhaseTiming {
  phase: Phase;
  /** Episodes that recorded this phase. */
  count: number;
  p50Ms: number | undefined;
  p95Ms: number | undefined;
}

export function phaseTimings(results: readonly ResultOutline[]): PhaseTiming[] {
  return PHASES.map((phase) => {
    const values: number[] = [];
    for (const r of results) {
      const ms = r.timings[`${phase}Ms`];
      if (ms !== undefined) values.push(ms);
    }
    // Sorted once for both percentiles.
    const sorted = Float64Array.from(values).sort();
    return { phase, count: values.length, p50Ms: sortedPercentile(sorted, 50), p95Ms: sortedPercentile(sorted, 95) };
  });
}

export interface TaskStats {
  taskId: string;
  /** Episodes of the task with a result, and those graded (a reward), passed (reward >= the pass threshold) and errored. */
  done: number;
  graded: number;
  passed: number;
  errors: number;
  /** Mean reward over graded episodes; null when none was graded. */
  meanReward: number | null;
  /** Unbiased pass@k per k (1 and the batch's samples per task), when the task has at least k graded. */
  passAt: Record<number, number>;
  /** Mean of each reward-file metric (a Harbor task's reward.json keys) over the episodes that reported it. */
  metrics: Record<string, number>;
}

/**
 * Per task: outcome counts, mean reward and pass@k for each k of `ks` (a success: a reward of at least
 * `passThreshold`, the batch's, else 1), hardest first (lowest mean reward; ungraded tasks last), ties
 * by task id.
 */
export function taskStats(results: readonly ResultOutline[], ks: readonly number[], passThreshold?: number): TaskStats[] {
  const byTask = new Map<string, { done: number; graded: number; passed: number; errors: number; sum: number; metrics: Map<string, { sum: number; n: number }> }>();
  for (const r of results) {
    let t = byTask.get(r.taskId);
    if (t === undefined) byTask.set(r.taskId, (t = { done: 0, graded: 0, passed: 0, errors: 0, sum: 0, metrics: new Map() }));
    for (const [key, value] of Object.entries(r.metrics ?? {})) {
      const m = t.metrics.get(key) ?? { sum: 0, n: 0 };
      m.sum += value;
      m.n += 1;
      t.metrics.set(key, m);
    }
    t.done += 1;
    if (r.status === 'error') t.errors += 1;
    if (r.reward !== null) {
      t.graded += 1;
      t.sum += r.reward;
      if (passes(r.reward, passThreshold)) t.passed += 1;
    }
  }
  const stats = [...byTask].map(([taskId, t]): TaskStats => ({
    taskId,
    done: t.done,
    graded: t.graded,
    passed: t.passed,
    errors: t.errors,
    meanReward: t.graded === 0 ? null : t.sum / t.graded,
    passAt: Object.fromEntries(ks.filter((k) => k >= 1 && t.graded >= k).map((k) => [k, passAtK(t.graded, t.passed, k)])),
    metrics: Object.fromEntries([...t.metrics].map(([k, m]) => [k, m.sum / m.n])),
  }));
  return stats.sort((a, b) => (a.meanReward ?? 2) - (b.meanReward ?? 2) || (a.taskId < b.taskId ? -1 : a.taskId > b.taskId ? 1 : 0));
}

export const TIMELINE_STATUSES = ['passed', 'failed', 'timeout', 'cancelled', 'error'] as const;

export interface TimelineBin {
  /** Start and end of the bin (ms since the epoch). */
  fromMs: number;
  toMs: number;
  counts: Record<(typeof TIMELINE_STATUSES)[number], number>;
}

/** Episodes finishing over [fromMs, toMs] in `binCount` equal bins, by status (endedAt of each result that has one). */
export function timelineBins(results: readonly ResultOutline[], fromMs: number, toMs: number, binCount = 48): TimelineBin[] {
  const span = Math.max(1, toMs - fromMs);
  const bins: TimelineBin[] = Array.from({ length: binCount }, (_, i) => ({
    fromMs: fromMs + (i * span) / binCount,
    toMs: fromMs + ((i + 1) * span) / binCount,
    counts: { passed: 0, failed: 0, timeout: 0, cancelled: 0, error: 0 },
  }));
  for (const r of results) {
    const at = r.endedAt === undefined ? Number.NaN : Date.parse(r.endedAt);
    if (Number.isNaN(at)) continue;
    const i = Math.min(binCount - 1, Math.max(0, Math.floor(((at - fromMs) / span) * binCount)));
    bins[i]!.counts[r.status] += 1;
  }
  return bins;
}
