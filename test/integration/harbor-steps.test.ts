// Harbor multi-step tasks (test/fixtures/harbor-steps, written for this suite): one environment for
// every step, each step's set-up, instruction, solution and tests; a min_reward gate that stops the
// steps after it; the mean or final reward, and every step's own reward and logs kept.
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, runTaskFolders, startEnvWorker, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';

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
  });

  it('an agent that does nothing fails every step (final strategy: the last step\'s reward)', async () => {
    const byTask = await run('{ kind: command, command: "true" }');
    expect(byTask.get('two-steps')).toMatchObject({ status: 'failed', reward: 0, metrics: { 'steps.one': 0, 'steps.two': 0 } });
    // Step one has no gate, so step two runs; its 0 misses the gate, and step three does not.
    const gated = byTask.get('gated-three')!;
    expect(gated).toMatchObject({ status: 'failed', reward: 0, metrics: { 'steps.one': 0, 'steps.two': 0 } });
    expect(gated.metrics).not.toHaveProperty('steps.three');
  });
});
