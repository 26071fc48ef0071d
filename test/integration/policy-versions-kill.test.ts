// Stale restarts and kill -9: two worker processes run a batch with maxStaleness 1; every episode spans
// two bumps and restarts from scratch; while the restarted conversations wait at the gate, one worker is
// killed outright. Its episodes come back by stall detection on the other, and every episode still ends
// with exactly one result, restarted once (the stale restart is not counted again, the kill is an infra
// stall), its conversation all at the last version.
import { once } from 'node:events';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FleetClient } from '../../src/client/fleet-client.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { batchCompletionsKey } from '../../src/redis/redis-keys.ts';
import {
  EXAMPLES, docker, fleetContainers, silentLog, spawnWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess,
} from '../helpers/fleet.ts';
import { startGate, type Gate } from '../helpers/model-gate.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const API_KEY = `sk-policy-kill-${process.pid}`;
const TASKS = ['fix-greeting', 'sum-column'].map((t) => path.join(EXAMPLES, 'tasks', t));

describe('stale restarts across kill -9', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let gate: Gate;
  let client: FleetClient;
  const workers: WorkerProcess[] = [];
  let batchId: string | undefined;

  beforeAll(async () => {
    env = await startFleetEnv();
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0 }, requireKey: API_KEY, log: silentLog });
    gate = await startGate(stub);
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
  });
  afterAll(async () => {
    gate?.release();
    await Promise.all(workers.map((w) => w.stop()));
    // Sandboxes of the killed worker that the survivor's reaper had not removed yet (a failed test).
    if (batchId !== undefined) for (const c of await fleetContainers('batch', batchId)) await docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined);
    await client?.close();
    await gate?.close();
    await stub?.close();
    await env?.close();
  });

  it('keeps every result exactly once, each restarted once, when a worker is killed during the restarts', async () => {
    const workerEnv = {
      ...env.env, MODEL_BASE_URL: gate.baseUrl, MODEL_API_KEY: API_KEY, MODEL_UPSTREAM_RETRIES: '1',
      // Short locks and leases: the killed worker's episodes and sandboxes come back within seconds.
      FLEET_LOCK_DURATION_MS: '4000', FLEET_LEASE_TTL_MS: '3000', FLEET_REAPER_INTERVAL_MS: '2000',
    };
    workers.push(spawnWorker(workerEnv, 'pvk-w1', 2), spawnWorker(workerEnv, 'pvk-w2', 2));
    await client.setPolicyVersion('default', 30);
    // First conversations wait at their second call while the version moves 30 -> 32; the restarted ones wait there too.
    gate.setHold((c) => c.turn === 1 && c.nth <= 2);
    const plan = await client.enqueue(await writeBatch(`name: kill\ntasks: ${JSON.stringify(TASKS)}\nsamples: 2\nagent: { kind: llm, maxTurns: 10 }\nmaxStaleness: 1\n`, {}));
    batchId = plan.batchId;
    expect(plan.jobs).toHaveLength(4);
    await gate.waitHeld(plan.batchId, 4);
    await client.setPolicyVersion('default', 31);
    await client.setPolicyVersion('default', 32);
    gate.release();
    // Every episode's next call is refused as stale; each restarts and waits again at its second call.
    await gate.waitHeld(plan.batchId, 4);
    expect(gate.held.every((h) => h.call.nth === 2)).toBe(true);
    const doomed = workers[0]!;
    const exited = once(doomed.child, 'exit');
    doomed.child.kill('SIGKILL');
    await exited;
    gate.release();

    const results = await waitForResults(env, plan.batchId, 4, 240_000);
    for (const r of results) {
      expect(r.status, `${r.episodeId}: ${JSON.stringify(r.error)} ${workers[1]!.output().slice(-2000)}`).toBe('passed');
      expect(r.staleRestarts).toBe(1);
      expect(r.policyVersions).toMatchObject({ endpoint: 'default', first: 32, last: 32, seen: [32] });
      expect(r.workerId).toBe('pvk-w2');
    }
    // The killed worker's episodes took a third attempt; the survivor's finished in their second.
    expect(results.map((r) => r.attempts).sort()).toEqual([2, 2, 3, 3]);
    expect(await env.client.xlen(batchCompletionsKey(env.prefix, plan.batchId))).toBe(4);
    expect((await client.status(plan.batchId))?.staleRestarts).toEqual({ episodes: 4, restarts: 4 });
    await waitForNoContainers(plan.batchId, 60_000);
  });
});
