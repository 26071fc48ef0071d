import { describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import { passAtK, summarize } from '../../src/results/batch-summary.ts';
import { resultsCsv } from '../../src/results/results-csv.ts';

function result(taskId: string, sample: number, status: EpisodeResult['status'], reward: number | null, totalMs: number): EpisodeResult {
  return {
    episodeId: `b.${taskId}.${sample}`, batchId: 'b', taskId, sample, status, reward, attempts: 1, workerId: 'w',
    timings: { totalMs, setupMs: totalMs / 10 }, provenance: { taskDigest: 'd', image: 'i', agent: { kind: 'oracle' } },
    ...(status === 'error' && { error: { kind: 'infra' as const, code: 'docker_timeout', message: 'slow, "very"' } }),
    startedAt: '', endedAt: '',
  };
}

describe('batch summary', () => {
  it('computes pass@k without bias', () => {
    expect(passAtK(4, 0, 1)).toBe(0);
    expect(passAtK(4, 1, 1)).toBeCloseTo(0.25);
    expect(passAtK(4, 1, 4)).toBe(1);
    expect(passAtK(4, 2, 2)).toBeCloseTo(1 - 1 / 6);
  });

  it('counts statuses and kinds, averages pass@k over tasks, takes phase percentiles', () => {
    const s = summarize('b', 5, [
      result('a', 0, 'passed', 1, 100), result('a', 1, 'failed', 0, 200),
      result('c', 0, 'failed', 0, 300), result('c', 1, 'error', null, 400),
    ]);
    expect(s).toMatchObject({ total: 5, done: 4, finished: false, byStatus: { passed: 1, failed: 2, error: 1 }, byKind: { infra: 1 } });
    expect(s.meanReward).toBeCloseTo(1 / 3);
    // Task a: 1 of 2 passed; task c: 0 of 1 graded (pass@2 only counts tasks with 2 graded samples).
    expect(s.passAt).toEqual({ 1: 0.25, 2: 1 });
    expect(s.phases.totalMs).toEqual({ p50: 200, p95: 400, n: 4 });
  });

  it('writes CSV with quoting', () => {
    const csv = resultsCsv([result('c', 1, 'error', null, 400)]).split('\n');
    expect(csv[1]).toMatch(/^b\.c\.1,b,c,1,error,infra,docker_timeout,,1,w,40,,,,400,,d,,oracle,"slow, ""very""",,,,,$/);
  });

  it('names the model and the policy versions in the CSV', () => {
    const played: EpisodeResult = {
      ...result('m', 0, 'passed', 1, 100),
      model: { endpoint: 'eval-b', name: 'qwen3-8b' }, policyVersions: { endpoint: 'eval-b', first: 3, last: 5, seen: [3, 4, 5] },
    };
    const [header, row] = resultsCsv([played]).split('\n');
    const cells = Object.fromEntries(header!.split(',').map((name, i) => [name, row!.split(',')[i]]));
    expect(cells).toMatchObject({ model_endpoint: 'eval-b', model_name: 'qwen3-8b', policy_first: '3', policy_last: '5', metrics: '' });
  });

  it('keeps float rewards and reward-file metrics: means per metric, in the summary and the CSV', () => {
    const withMetrics = (sample: number, metrics: Record<string, number>, reward: number) => ({ ...result('h', sample, 'failed', reward, 100), metrics });
    const results = [withMetrics(0, { correctness: 1, documentation: 0 }, 0.5), withMetrics(1, { correctness: 0.5 }, 0.5), result('h', 2, 'passed', 1, 100)];
    const s = summarize('b', 3, results);
    expect(s.meanReward).toBeCloseTo(2 / 3);
    expect(s.metrics).toEqual({ correctness: { mean: 0.75, n: 2 }, documentation: { mean: 0, n: 1 } });
    expect(resultsCsv(results).split('\n')[1]).toMatch(/,"\{""correctness"":1,""documentation"":0\}"$/);
  });
});
