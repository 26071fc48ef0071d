// Tasks of the fleet's own format that opt in to a reward file (verify.reward: file,
// test/fixtures/reward-file): the verifier's reward.txt or reward.json is the grade, read as a Harbor
// task's is, its exit code ignored; partial credit is kept as a float with its metrics; a grader that
// wrote nothing is an error of kind verifier (a file the agent planted never counts); and the batch's
// passThreshold decides passed or failed, and pass@k, on real episodes.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, enqueueFile, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/reward-file');

describe('reward-file grading of our own tasks', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'reward-file-w', { concurrency: 3 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  async function run(agent: string, extra = ''): Promise<{ batchId: string; byTask: Record<string, EpisodeResult> }> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-reward-file-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `name: reward-file\ntasks: [${JSON.stringify(FIXTURES)}]\nagent: ${agent}\nsamples: 1\n${extra}`);
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 240_000);
    await waitForNoContainers(plan.batchId);
    return { batchId: plan.batchId, byTask: Object.fromEntries(results.map((r) => [r.taskId, r])) };
  }

  it('the oracle gets full credit from the reward files; a grader that wrote none is an error, whatever the agent planted', async () => {
    const { byTask } = await run('{ kind: oracle }');
    expect(byTask['four-checks']).toMatchObject({ status: 'passed', reward: 1, metrics: { reward: 1 } });
    // The verifier exited 3: under exit-code grading a broken verifier, here ignored.
    expect(byTask['four-checks']!.verifier?.exitCode).toBe(3);
    expect(byTask['two-metrics']).toMatchObject({ status: 'passed', reward: 1, metrics: { correctness: 1, style: 1 } });
    expect(byTask['silent-grader']).toMatchObject({ status: 'error', reward: null, error: { kind: 'verifier', code: 'reward_file_missing' } });
    // The reward file is kept with the evidence, as a Harbor task's is.
    const logs = path.join(env.dataDir, 'evidence', byTask['four-checks']!.episodeId, 'attempt-1', 'logs', 'verifier');
    await expect(readFile(path.join(logs, 'reward.txt'), 'utf8')).resolves.toBe('1\n');
  });

  it('partial credit is a float with its metrics, failed under the default threshold of 1', async () => {
    const { batchId, byTask } = await run(`{ kind: command, command: "echo ok > a.txt; printf '42\\\\n\\\\n' > answer.txt" }`);
    expect(byTask['four-checks']).toMatchObject({ status: 'failed', reward: 0.25, metrics: { reward: 0.25 } });
    // No `reward` key in reward.json: the main reward is the mean of its values.
    expect(byTask['two-metrics']).toMatchObject({ status: 'failed', reward: 0.5, metrics: { correctness: 1, style: 0 } });
    const summary = await env.results.summary(batchId);
    expect(summary).toMatchObject({ passThreshold: 1, passAt: { 1: 0 }, byStatus: { passed: 0, failed: 2, error: 1 } });
    expect(summary!.meanReward).toBeCloseTo(0.375);
  });

  it("the batch's passThreshold makes the same partial credit a pass, and pass@k counts it", async () => {
    const { batchId, byTask } = await run(`{ kind: command, command: "echo ok > a.txt; printf '42\\\\n\\\\n' > answer.txt" }`, 'passThreshold: 0.25\n');
    expect(byTask['four-checks']).toMatchObject({ status: 'passed', reward: 0.25 });
    expect(byTask['two-metrics']).toMatchObject({ status: 'passed', reward: 0.5 });
    const summary = await env.results.summary(batchId);
    expect(summary).toMatchObject({ passThreshold: 0.25, passAt: { 1: 1 }, byStatus: { passed: 2, error: 1 } });
    expect((await env.results.getManifest(batchId))?.passThreshold).toBe(0.25);
  });
});
