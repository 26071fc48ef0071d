// The batch's pass threshold: validated and named in errors, part of the batch id, carried by every
// episode job and the manifest, and what status passed, pass@k and the pass rate count by.
import { cp, mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { EpisodeJob } from '../../src/episode/episode-job.ts';
import { planBatch } from '../../src/producer/enqueue-batch.ts';
import { formatSummary, summarize } from '../../src/results/batch-summary.ts';
import { taskStats } from '../../src/dashboard/batch-stats.ts';
import { loadBatch } from '../../src/tasks/load-task.ts';
import { passes } from '../../src/tasks/batch-spec.ts';

const TASK = path.join(import.meta.dirname, '../../examples/tasks/sum-column');

async function batchFile(extra: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-threshold-'));
  await cp(TASK, path.join(dir, 'sum-column'), { recursive: true });
  const file = path.join(dir, 'batch.yaml');
  await writeFile(file, `name: thr\ntasks: [sum-column]\nsamples: 2\nagent: { kind: oracle }\n${extra}`);
  return file;
}

function result(taskId: string, sample: number, reward: number | null): EpisodeResult {
  return {
    episodeId: `b.${taskId}.${sample}`, batchId: 'b', taskId, sample, status: reward === null ? 'error' : 'failed', reward, attempts: 1, workerId: 'w',
    timings: { totalMs: 1 }, provenance: { taskDigest: 'd', image: 'i', agent: { kind: 'oracle' } }, startedAt: '', endedAt: '',
  };
}

describe('pass threshold', () => {
  it.each([
    ['-0.5', '-0.5'], ['0', '0'], ['.nan', 'NaN'], ['.inf', 'Infinity'], ['"0.5"', '"0.5"'], ['[1]', 'a list of 1 item'],
  ])('refuses passThreshold: %s, naming the field and the value', async (yaml, shown) => {
    const file = await batchFile(`passThreshold: ${yaml}\n`);
    const err = await loadBatch(file).then(() => undefined, (e: Error) => e);
    expect(err?.message).toContain(`passThreshold: expected a finite number greater than 0 (the reward an episode needs to pass) (got ${shown})`);
  });

  it('is part of the batch id, carried by every job and the plan; a batch without one keeps its old id', async () => {
    const none = await planBatch(await loadBatch(await batchFile('')));
    const half = await planBatch(await loadBatch(await batchFile('passThreshold: 0.5\n')));
    const quarter = await planBatch(await loadBatch(await batchFile('passThreshold: 0.25\n')));
    expect(new Set([none.batchId, half.batchId, quarter.batchId]).size).toBe(3);
    // The id this batch had before the field existed (measured with the code before it).
    expect(none.batchId).toBe('thr-77b4d4df60e9');
    expect(none.passThreshold).toBeUndefined();
    expect(none.jobs.every((j) => j.passThreshold === undefined)).toBe(true);
    expect(half.passThreshold).toBe(0.5);
    expect(half.jobs.map((j) => j.passThreshold)).toEqual([0.5, 0.5]);
    // The same batch again names the same id.
    expect((await planBatch(await loadBatch(await batchFile('passThreshold: 0.5\n')))).batchId).toBe(half.batchId);
    // A job's threshold is validated as the batch's is.
    expect(EpisodeJob.safeParse({ ...half.jobs[0], passThreshold: -1 }).success).toBe(false);
  });

  it('counts pass@k and the per-task pass counts by the threshold, and the summary says it', () => {
    expect(passes(0.5, 0.5)).toBe(true);
    expect(passes(0.49, 0.5)).toBe(false);
    expect(passes(0.99, undefined)).toBe(false);
    expect(passes(1, undefined)).toBe(true);
    expect(passes(null, 0.1)).toBe(false);
    const results = [result('a', 0, 0.25), result('a', 1, 0.75), result('c', 0, 0.5), result('c', 1, null)];
    const strict = summarize('b', 4, results);
    expect(strict).toMatchObject({ passThreshold: 1, passAt: { 1: 0, 2: 0 } });
    const half = summarize('b', 4, results, 0.5);
    // Task a: 1 of 2 at or above 0.5 (pass@1 0.5); task c: 1 of 1 graded (pass@1 1). pass@2: task a only.
    expect(half).toMatchObject({ passThreshold: 0.5, passAt: { 1: 0.75, 2: 1 } });
    expect(formatSummary(half)).toContain('pass@1 0.750, pass@2 1.000 (passed: reward >= 0.5)');
    expect(formatSummary(strict)).not.toContain('passed: reward >=');
    const byTask = Object.fromEntries(taskStats(results, [1, 2], 0.5).map((t) => [t.taskId, t]));
    expect(byTask.a).toMatchObject({ passed: 1, passAt: { 1: 0.5, 2: 1 } });
    expect(byTask.c).toMatchObject({ passed: 1, passAt: { 1: 1 } });
    expect(taskStats(results, [1, 2]).map((t) => t.passed)).toEqual([0, 0]);
  });
});
