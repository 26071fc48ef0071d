// Harbor multi-step tasks (test/fixtures/harbor-steps, written for this suite): one environment for
// every step, each step's set-up, instruction, solution and tests; a min_reward gate that stops the
// steps after it; the mean or final reward, and every step's own reward and logs kept.
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { episodeStepsKey } from '../../src/redis/redis-keys.ts';
import { ROOT, enqueueFile, runTaskFolders, spawnWorker, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor-steps');

describe('Harbor multi-step tasks', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'steps-w', { concurrency: 2 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  const run = (agent: string) => runTaskFolders(env, [FIXTURES], agent);

  it('the oracle runs every step in one environment; a missed gate stops the steps after it', async () => {
    const byTask = await run('{ kind: oracle }');
    // Step two reads what step one left (and step one's setup.sh made): one environment for both.
    expect(byTask.get('two-steps')).toMatchObject({ status: 'passed', reward: 1, metrics: { reward: 1, 'steps.one': 1, 'steps.two': 1 } });
    // Step two's reward 0.5 misses its min_reward of 1: step three never runs; the mean is over the two graded.
    const gated = byTask.get('gated-three')!;
    expect(gated).toMatchObject({ status: 'failed', reward: 0.75, metrics: { reward: 0.75, 'steps.one': 1, 'steps.two': 0.5 } });
    expect(gated.metrics).not.toHaveProperty('steps.three');
    const logs = path.join(env.dataDir, 'evidence', gated.episodeId, 'attempt-1', 'logs', 'steps');
    expect((await readdir(logs)).sort()).toEqual(['one', 'two']);
    expect((await readdir(path.join(logs, 'two', 'verifier'))).sort()).toContain('reward.txt');
    // A separate verifier per step: each grades in a fresh container (the agent's private file unseen),
    // and step two still works on in step one's environment.
    expect(byTask.get('separate-steps'), JSON.stringify(byTask.get('separate-steps')?.error)).toMatchObject({
      status: 'passed', reward: 1, metrics: { reward: 1, fresh: 1, 'steps.one': 1, 'steps.two': 1 },
    });
  });

  it('an agent that does nothing fails every step (final strategy: the last step\'s reward)', async () => {
    const byTask = await run('{ kind: command, command: "true" }');
    expect(byTask.get('two-steps')).toMatchObject({ status: 'failed', reward: 0, metrics: { 'steps.one': 0, 'steps.two': 0 } });
    // Step one has no gate, so step two runs; its 0 misses the gate, and step three does not.
    const gated = byTask.get('gated-three')!;
    expect(gated).toMatchObject({ status: 'failed', reward: 0, metrics: { 'steps.one': 0, 'steps.two': 0 } });
    expect(gated.metrics).not.toHaveProperty('steps.three');
    expect(byTask.get('separate-steps')).toMatchObject({ status: 'failed', reward: 0, metrics: { fresh: 1, 'steps.one': 0, 'steps.two': 0 } });
  });
});

describe('a multi-step episode whose worker is killed in a step', () => {
  let env: FleetEnv;
  const processes: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(processes.map((w) => w.stop()));
    await env?.close();
  });

  it('resumes at that step on another worker, the steps before it neither run nor graded again', async () => {
    const fast = { FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000', FLEET_LOCK_DURATION_MS: '4000' };
    const victim = spawnWorker({ ...env.env, ...fast }, 'steps-victim', 1);
    processes.push(victim);
    const task = path.join(ROOT, 'test/fixtures/harbor-steps-resume/resumable');
    const plan = await enqueueFile(env, await writeBatch(`tasks: [${JSON.stringify(task)}]\nagent: { kind: oracle }\n`, {}));
    const episodeId = plan.jobs[0]!.episodeId;
    // Step one's boundary is kept; step two's solution takes seconds: the worker dies in it.
    await waitFor('step one\'s boundary kept', async () => (await env.client.hget(episodeStepsKey(env.prefix, episodeId), 'done')) !== null, 120_000, 100);
    victim.child.kill('SIGKILL');
    const rescuer = spawnWorker({ ...env.env, ...fast }, 'steps-rescuer', 1);
    processes.push(rescuer);
    const [result] = await waitForResults(env, plan.batchId, 1, 180_000);
    // Each step's test checks the whole trace: step one run again would have written its line twice.
    expect(result, rescuer.output().slice(-2000)).toMatchObject({ status: 'passed', reward: 1, attempts: 2, workerId: 'steps-rescuer', metrics: { 'steps.one': 1, 'steps.two': 1, 'steps.three': 1 } });
    expect(await env.client.exists(episodeStepsKey(env.prefix, episodeId))).toBe(0);
    // The dead worker's sandbox goes to the reaper.
    await waitForNoContainers(plan.batchId, 90_000);
  }, 300_000);
});
