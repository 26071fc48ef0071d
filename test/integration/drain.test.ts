// SIGTERM drains a worker: it stops taking jobs, gives running episodes the drain timeout, then hands
// them back to the queue so another worker picks them up at once (not after a stall timeout), and
// exits 0.
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { leaseKey } from '../../src/redis/redis-keys.ts';
import { fleetContainers, spawnWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, waitForSandboxFile, type FleetEnv, type WorkerProcess, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

describe('drain on SIGTERM', () => {
  let env: FleetEnv;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    await env?.close();
  });

  it('hands running episodes to another worker within seconds and exits 0', async () => {
    // Default lock duration (30 s): a hand-over that waited for a stall would take far longer.
    const leaving = spawnWorker({ ...env.env, FLEET_DRAIN_TIMEOUT_MS: '1000' }, 'leaving');
    workers.push(leaving);
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "touch started; sleep 8; echo fixed > state.txt" }\n', {
      long: {
        yaml: 'id: long\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\n',
        files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
      },
    });
    const plan = await enqueueFile(env, file);
    const episodeId = plan.jobs[0]!.episodeId;
    await waitForSandboxFile('worker', 'leaving', '/workspace/started');

    const staying = spawnWorker(env.env, 'staying');
    workers.push(staying);
    await waitFor('the second worker to hold its lease', async () => (await env.client.exists(leaseKey(env.prefix, 'staying'))) === 1, 30_000);
    const sigterm = Date.now();
    const code = await leaving.stop();
    expect(code).toBe(0);
    await waitFor('the episode to restart on the other worker', async () =>
      (await fleetContainers('worker', 'staying')).some((c) => c.Labels['rollout-fleet.episode'] === episodeId), 20_000, 100);
    expect(Date.now() - sigterm).toBeLessThan(15_000);

    const [result] = await waitForResults(env, plan.batchId, 1, 60_000);
    expect(result).toMatchObject({ status: 'passed', reward: 1, workerId: 'staying', attempts: 2 });
    // The drained attempt kept its evidence.
    expect(await readdir(path.join(env.dataDir, 'evidence', episodeId))).toContain('attempt-1');
    await waitForNoContainers(plan.batchId);
  });
});
