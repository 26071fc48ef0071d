// Admission counts an environment by what it costs, not as one container: a worker of 3 slots whose
// memory budget (1500 MiB) holds two one-container episodes of 512 MiB runs two of those at once, but
// only one environment of main + api sidecar (512 MiB each and the holder's 32: 1056 MiB) at a time;
// the others wait their turn and every episode still passes. What runs at once is read from the engine.
import path from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { LABEL } from '../../src/sandbox/labels.ts';
import { readHostFacts } from '../../src/worker/host-facts.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, enqueueFile, fleetContainers, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const API_SIDECAR = path.join(ROOT, 'test/fixtures/harbor-services/api-sidecar');
const plainTask = {
  yaml: 'id: fix\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\nlimits: { memoryMb: 512 }\nreserves: { setupSec: 60, verifySec: 20, closeSec: 20 }\n',
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
};

/** Polls the engine every 100 ms: the most containers of `role` (or plain sandboxes) of the batch running at once. */
function peak(batchId: string, counts: (c: Awaited<ReturnType<typeof fleetContainers>>[number]) => boolean) {
  let most = 0;
  let stopped = false;
  const loop = (async () => {
    while (!stopped) {
      const running = (await fleetContainers('batch', batchId)).filter((c) => c.State === 'running' && counts(c));
      most = Math.max(most, running.length);
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  return { async stop() { stopped = true; await loop; return most; } };
}

describe('admission by what an environment costs', () => {
  let env: FleetEnv;
  let worker: WorkerHandle | undefined;

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterEach(async () => {
    await worker?.close();
    worker = undefined;
  });
  afterAll(async () => {
    await env?.close();
  });

  it('one-container episodes: as many at once as the memory budget holds (two of 512 MiB in 1500)', async () => {
    worker = await startEnvWorker(env, 'cost-plain', { concurrency: 3, resources: { memoryMb: 1500 } });
    const file = await writeBatch('tasks: [tasks]\nsamples: 3\nagent: { kind: command, command: "sleep 3; echo fixed > state.txt" }\n', { fix: plainTask });
    const plan = await enqueueFile(env, file);
    const sandboxes = peak(plan.batchId, () => true);
    const results = await waitForResults(env, plan.batchId, 3, 180_000);
    expect(await sandboxes.stop()).toBe(2);
    for (const r of results) expect(r, JSON.stringify(r.error)).toMatchObject({ status: 'passed', reward: 1 });
    await waitForNoContainers(plan.batchId);
  }, 240_000);

  it('a main + sidecar environment counts as its three containers: one at a time in the same budget, every episode passes', async () => {
    worker = await startEnvWorker(env, 'cost-services', { concurrency: 3, resources: { memoryMb: 1500 } });
    const agent = '{ kind: command, command: "sleep 2; python3 -c \\"import urllib.request; print(urllib.request.urlopen(\'http://api:8000/word\').read().decode(), end=\'\')\\" > /app/answer.txt" }';
    const file = await writeBatch(`tasks: [${JSON.stringify(API_SIDECAR)}]\nsamples: 3\nagent: ${agent}\n`, {});
    const plan = await enqueueFile(env, file);
    const holders = peak(plan.batchId, (c) => c.Labels[LABEL.environmentRole] === 'holder');
    // The worker's facts (the dashboard's /hosts) show one environment's cost taken and the others waiting.
    const facts = await waitFor('the facts to show an environment running and episodes waiting', async () =>
      (await readHostFacts(env.client, env.prefix)).find((f) => f.workerId === 'cost-services' && (f.budget?.waiting ?? 0) > 0)?.budget, 120_000, 100);
    expect(facts).toMatchObject({ memoryMb: 1500, usedMemoryMb: 1056, containers: 3 });
    const results = await waitForResults(env, plan.batchId, 3, 300_000);
    expect(await holders.stop()).toBe(1);
    for (const r of results) expect(r, JSON.stringify(r.error)).toMatchObject({ status: 'passed', reward: 1 });
    // While one ran, the others waited in the worker, not on the engine.
    expect(worker.budget.snapshot()).toMatchObject({ limits: { memoryMb: 1500 }, waiting: 0 });
    await waitForNoContainers(plan.batchId);
  }, 360_000);
});
