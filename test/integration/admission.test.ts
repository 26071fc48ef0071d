// Self-tuning concurrency on a real in-process worker, real Docker calls and BullMQ: the controller's
// allowance becomes the episodes Worker's concurrency, and BullMQ really runs that many episodes at
// once: raised from 1 while the engine is healthy, cut to the floor when every call counts as too slow
// (a latency budget of 0 ms). The allowance and the measured latency reach the host facts and /metrics.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { createFleetMetrics } from '../../src/dashboard/fleet-metrics.ts';
import { readHostFacts } from '../../src/worker/host-facts.ts';
import { enqueueFile, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const task = {
  yaml: 'id: fix\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 40, verifySec: 20, closeSec: 20 }\n',
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
};

/** Samples, every 20 ms, the Worker's concurrency and the episodes running, until stopped. */
function trace(worker: WorkerHandle) {
  const points: { concurrency: number; running: number }[] = [];
  const sample = () => points.push({ concurrency: worker.concurrency(), running: worker.running.size });
  sample();
  const timer = setInterval(sample, 20);
  return { points, stop: () => clearInterval(timer) };
}

describe('self-tuning concurrency', () => {
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

  async function runBatch(samples: number, sleepSec: number) {
    const file = await writeBatch(`tasks: [tasks]\nsamples: ${samples}\nagent: { kind: command, command: "sleep ${sleepSec}; echo fixed > state.txt" }\n`, { fix: task });
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, samples, 120_000);
    await waitForNoContainers(plan.batchId, 60_000);
    return results;
  }

  it('raises the Worker\'s concurrency from 1 while the engine is healthy, and BullMQ runs more episodes at once', async () => {
    worker = await startEnvWorker(env, 'tune-up', {
      concurrency: 6, leaseTtlMs: 3_000,
      admission: { autotune: true, initial: 1, windowMs: 250, minSamples: 2, maxSlowdown: 1e6, maxLatencyMs: 60_000 },
    });
    expect(worker.concurrency()).toBe(1);
    const t = trace(worker);
    const results = await runBatch(8, 2);
    t.stop();
    expect(results.map((r) => r.status)).toEqual(Array(8).fill('passed'));
    expect(Math.max(...t.points.map((p) => p.concurrency))).toBeGreaterThanOrEqual(4);
    expect(Math.max(...t.points.map((p) => p.running))).toBeGreaterThanOrEqual(3);
    expect(worker.admission.snapshot()).toMatchObject({ autotune: true, decreases: 0, ceiling: 6 });
    expect(worker.admission.snapshot().increases).toBeGreaterThanOrEqual(2);

    // The facts the worker reports, and the dashboard's gauges built on them.
    const facts = await waitFor('host facts with a measured window', async () => {
      const [f] = await readHostFacts(env.client, env.prefix);
      return f?.admission?.engineP90Ms !== undefined ? f : undefined;
    }, 15_000, 100);
    expect(facts.admission).toMatchObject({ autotune: true, floor: 1, allowance: worker.admission.allowance });
    const metrics = createFleetMetrics({
      queues: [], results: env.results, activeLeases: async () => 1, reapedSandboxes: async () => 0,
      workers: () => readHostFacts(env.client, env.prefix),
    });
    const text = await metrics.render();
    expect(text).toMatch(new RegExp(`rollout_fleet_worker_concurrency_allowance\\{worker="tune-up",host="[^"]+"\\} ${facts.admission!.allowance}\\n`));
    expect(text).toMatch(/rollout_fleet_worker_concurrency_ceiling\{worker="tune-up",host="[^"]+"\} 6\n/);
    expect(text).toMatch(/rollout_fleet_worker_engine_latency_p90_seconds\{worker="tune-up",host="[^"]+"\} \d/);
  });

  it('cuts the Worker\'s concurrency to the floor when the engine is too slow, and BullMQ then runs one at a time', async () => {
    worker = await startEnvWorker(env, 'tune-down', {
      concurrency: 4,
      // A latency budget of 0 ms: every window with calls to judge is congested.
      admission: { autotune: true, windowMs: 250, minSamples: 2, maxLatencyMs: 0 },
    });
    expect(worker.concurrency()).toBe(4);
    const t = trace(worker);
    const results = await runBatch(8, 1);
    t.stop();
    expect(results.map((r) => r.status)).toEqual(Array(8).fill('passed'));
    expect(worker.concurrency()).toBe(1);
    expect(Math.max(...t.points.map((p) => p.running))).toBeGreaterThanOrEqual(2);
    // Once the cut to 1 took effect (one episode left running), BullMQ never ran two again.
    const effective = t.points.findIndex((p) => p.concurrency === 1 && p.running <= 1);
    expect(effective).toBeGreaterThan(0);
    expect(Math.max(...t.points.slice(effective).map((p) => p.running))).toBe(1);
    expect(worker.admission.snapshot()).toMatchObject({ allowance: 1, increases: 0 });
    expect(worker.admission.snapshot().decreases).toBeGreaterThanOrEqual(2);
  });

  it('keeps a fixed concurrency without autotune, still measuring the engine', async () => {
    worker = await startEnvWorker(env, 'fixed', { concurrency: 3, admission: { autotune: false, windowMs: 250, minSamples: 2, maxLatencyMs: 0 } });
    const t = trace(worker);
    await runBatch(4, 0);
    t.stop();
    expect(new Set(t.points.map((p) => p.concurrency))).toEqual(new Set([3]));
    expect(worker.admission.snapshot()).toMatchObject({ autotune: false, allowance: 3, decreases: 0, increases: 0 });
    expect(worker.admission.snapshot().latency?.p90Ms).toBeGreaterThan(0);
  });
});
