// The numbers `status` and `enqueue --wait` print: counts by status and failure kind, mean reward,
// how many are still to come.
import type { EpisodeResult, EpisodeStatus } from '../../queues/episodes/contract.ts';
import type { FailureKind } from '../errors/fleet-error.ts';

export interface BatchSummary {
  batchId: string;
  total: number;
  done: number;
  finished: boolean;
  byStatus: Record<EpisodeStatus, number>;
  byKind: Partial<Record<FailureKind, number>>;
  /** Mean reward over graded episodes; null when none was graded yet. */
  meanReward: number | null;
}

export function summarize(batchId: string, total: number, results: readonly EpisodeResult[]): BatchSummary {
  const byStatus: Record<EpisodeStatus, number> = { passed: 0, failed: 0, timeout: 0, cancelled: 0, error: 0 };
  const byKind: Partial<Record<FailureKind, number>> = {};
  let rewardSum = 0;
  let graded = 0;
  for (const r of results) {
    byStatus[r.status] += 1;
    if (r.error) byKind[r.error.kind] = (byKind[r.error.kind] ?? 0) + 1;
    if (r.reward !== null) {
      rewardSum += r.reward;
      graded += 1;
    }
  }
  return {
    batchId,
    total,
    done: results.length,
    finished: results.length >= total,
    byStatus,
    byKind,
    meanReward: graded === 0 ? null : rewardSum / graded,
  };
}

export function formatSummary(s: BatchSummary): string {
  const statuses = Object.entries(s.byStatus).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`).join(', ');
  const kinds = Object.entries(s.byKind).map(([k, n]) => `${k} ${n}`).join(', ');
  return [
    `batch ${s.batchId}: ${s.done}/${s.total} done${s.finished ? '' : ' (running)'}`,
    `  ${statuses || 'no results yet'}${kinds ? ` | errors by kind: ${kinds}` : ''}`,
    `  mean reward ${s.meanReward === null ? '-' : s.meanReward.toFixed(3)}`,
  ].join('\n');
}
