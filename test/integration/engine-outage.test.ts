// Stopping dockerd mid-episode is an infrastructure failure: not graded, retried with backoff, and
// the retry succeeds once dockerd is back. Runs on a private second engine.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { startFleetEnv, waitFor, waitForResults, type FleetEnv, startEnvWorker, enqueueFile, fleetContainers, waitForSandboxFile } from '../helpers/fleet.ts';
import { createSecondEngine, type SecondEngine } from '../helpers/second-engine.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

describe('Docker engine outage', () => {
  let env: FleetEnv;
  let engine: SecondEngine;
  let worker: WorkerHandle | undefined;

  beforeAll(async () => {
    env = await startFleetEnv();
    engine = await createSecondEngine();
  });
  afterAll(async () => {
    await worker?.close();
    await engine?.destroy();
    await env?.close();
  });

  /**
   * A fresh in-process worker on the second engine and one episode whose agent marks its start, then
   * works `agentSec` seconds and fixes the task; returns once the agent runs.
   */
  async function startedEpisode(name: string, agentSec: number) {
    await worker?.close();
    worker = await startEnvWorker(env, `${name}-w`, { docker: engine.docker, concurrency: 1, callTimeoutMs: 10_000, outputCapBytes: 64 * 1024, retryBudgets: { infra: 5 }, reaperIntervalMs: 1_000 });
    const file = await writeBatch(`name: ${name}\ntasks: [tasks]\nagent: { kind: command, command: "touch started; sleep ${agentSec}; echo fixed > state.txt" }\n`, {
      [name]: {
        yaml: `id: ${name}\ninstruction: x\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\nreserves: { setupSec: 20, closeSec: 15 }\n`,
        files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
      },
    });
    const plan = await enqueueFile(env, file);
    const episodeId = plan.jobs[0]!.episodeId;
    await waitForSandboxFile('episode', episodeId, '/workspace/started', 1, 60_000, engine.docker);
    return { plan, episodeId };
  }

  it('records the failed attempt as infra, not graded, and the retry passes once dockerd is back', async () => {
    const { plan, episodeId } = await startedEpisode('outage', 5);

    await engine.stop();
    // The attempt fails as infra (its evidence says so) while the engine is down.
    const firstResult = path.join(env.dataDir, 'evidence', episodeId, 'attempt-1', 'result.json');
    const first = await waitFor('attempt 1 to end', async () => readFile(firstResult, 'utf8').then((t) => JSON.parse(t) as { status: string; reward: unknown; error?: { kind: string } }, () => undefined), 60_000, 200);
    expect(first).toMatchObject({ status: 'error', reward: null, error: { kind: 'infra' } });
    expect(await env.results.get(plan.batchId, episodeId)).toBeUndefined();

    await engine.start();
    const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(result).toMatchObject({ status: 'passed', reward: 1 });
    expect(result!.attempts).toBeGreaterThanOrEqual(2);
    // The dead attempt's container is removed by the cleanup queue's retries once the engine is back.
    await waitFor('no sandbox left on the engine', async () =>
      (await fleetContainers('fleet', env.prefix, engine.docker)).length === 0, 60_000, 500);
  });

  it('never grades an agent whose sandbox was stopped under it: the attempt is infra, the retry passes', async () => {
    const { plan, episodeId } = await startedEpisode('stopped', 8);

    // What a dockerd restart does to a running sandbox, with the engine answering all along: the
    // container is killed, the agent's exec ends with 137. Verifying now (the sandbox restarted for
    // verification) would grade a workspace the agent never finished.
    const [sandbox] = await fleetContainers('episode', episodeId, engine.docker);
    await engine.docker.getContainer(sandbox!.Id).kill();
    const firstResult = path.join(env.dataDir, 'evidence', episodeId, 'attempt-1', 'result.json');
    const first = await waitFor('attempt 1 to end', async () => readFile(firstResult, 'utf8').then((t) => JSON.parse(t) as { status: string; reward: unknown; error?: { kind: string; code: string } }, () => undefined), 60_000, 200);
    expect(first, JSON.stringify(first)).toMatchObject({ status: "error", reward: null, error: { kind: "infra", code: "sandbox_lost" } });

    const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(result).toMatchObject({ status: 'passed', reward: 1 });
    expect(result!.attempts).toBeGreaterThanOrEqual(2);
    await waitFor('no sandbox left on the engine', async () =>
      (await fleetContainers('fleet', env.prefix, engine.docker)).length === 0, 60_000, 500);
  });
});
