// The dashboard's per-task table gets a mean per reward-file metric (Harbor tasks' reward.json keys).
import { describe, expect, it } from 'vitest';
import { taskStats } from '../../src/dashboard/batch-stats.ts';
import type { ResultOutline } from '../../src/results/result-outline.ts';

const outline = (taskId: string, reward: number | null, metrics?: Record<string, number>): ResultOutline => ({
  episodeId: `${taskId}.${Math.random()}`, taskId, status: reward === null ? 'error' : reward >= 1 ? 'passed' : 'failed', reward, attempts: 1, workerId: 'w',
  timings: { totalMs: 1 }, ...(metrics && { metrics }),
});

describe('task stats', () => {
  it('means each metric over the episodes that reported it; a float reward counts as passed only at 1', () => {
    const [t] = taskStats([outline('h', 0.5, { correctness: 1, style: 0 }), outline('h', 1, { correctness: 0 }), outline('h', null)], [1]);
    expect(t).toMatchObject({ taskId: 'h', done: 3, graded: 2, passed: 1, errors: 1, meanReward: 0.75, metrics: { correctness: 0.5, style: 0 } });
    expect(taskStats([outline('plain', 1)], [1])[0]!.metrics).toEqual({});
  });
});
