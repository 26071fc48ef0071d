// kill -9 of a worker with running episodes: its lease expires, another worker's reaper removes its
// sandboxes (salvaging their workspaces first), the episodes are taken over once their job locks
// lapse, and every episode still ends exactly once.
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fleetContainers, waitForSandboxFile, spawnWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const slowTask = (id: string) => ({
  yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\nreserves: { setupSec: 20, closeSec: 20 }\n`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
});

describe('reaper', () => {
  let env: FleetEnv;
  const workers: WorkerProcess[] = [];
  const fast = { FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000', FLEET_LOCK_DURATION_MS: '4000' };

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    await env?.close();
  });

  it('removes the sandboxes of a worker killed with -9, and its episodes still end exactly once', async () => {
    const victim = spawnWorker({ ...env.env, ...fast }, 'victim');
    workers.push(victim);
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "echo work > notes.txt; sleep 6; echo fixed > state.txt" }\n', {
      a: slowTask('a'),
      b: slowTask('b'),
    });
    const plan = await enqueueFile(env, file);

    // Both episodes are running in the victim's sandboxes (the agent has written its notes).
    await waitForSandboxFile('worker', 'victim', '/workspace/notes.txt', 2);
    victim.child.kill('SIGKILL');

    const started = Date.now();
    const rescuer = spawnWorker({ ...env.env, ...fast }, 'rescuer');
    workers.push(rescuer);
    await waitFor('the victim\'s sandboxes to be reaped', async () => (await fleetContainers('worker', 'victim')).length === 0, 30_000);
    // Lease TTL (2 s) + reaper interval (1 s) + a worker start-up and the removal itself.
    expect(Date.now() - started).toBeLessThan(20_000);

    const results = await waitForResults(env, plan.batchId, 2, 90_000);
    for (const r of results) {
      expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1, workerId: 'rescuer', attempts: 2 });
      // What the victim's sandbox held was salvaged before removal.
      const folders = await readdir(path.join(env.dataDir, 'evidence', r.episodeId));
      const salvaged = folders.find((f) => f.startsWith('salvaged-'));
      expect(salvaged, folders.join(',')).toBeDefined();
      expect(await readFile(path.join(env.dataDir, 'evidence', r.episodeId, salvaged!, 'notes.txt'), 'utf8')).toBe('work\n');
    }
    expect(new Set(results.map((r) => r.episodeId)).size).toBe(2);
    await waitForNoContainers(plan.batchId);
  });
});
