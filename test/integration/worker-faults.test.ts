// Worker processes facing Redis faults, as operators meet them: SIGTERM while Redis is down must still
// end the process within its drain timeout, and an outage must be logged once per connection, then its
// recovery with a count, not once per failed reconnect.
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { afterEach, describe, expect, it } from 'vitest';
import { runningEpisodes } from '../../src/cli/progress.ts';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import { leaseKey } from '../../src/redis/redis-keys.ts';
import {
  BIN, docker, enqueueFile, fleetContainers, fleetEnvOn, sandboxHasFile, spawnWorker, waitFor, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess,
} from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

/** Kill Redis outright (no shutdown, no goodbye to its clients) and wait until it is gone. */
async function killRedis(redis: PrivateRedis): Promise<void> {
  const exited = once(redis.process, 'exit');
  redis.process.kill('SIGKILL');
  await exited;
}

/** kill -9: the worker gets no chance to hand anything back. */
async function killWorker(worker: WorkerProcess): Promise<void> {
  const exited = once(worker.child, 'exit');
  worker.child.kill('SIGKILL');
  await exited;
}

/** The worker's pino lines (JSON on stderr) at warn and above. */
function logLines(worker: WorkerProcess): Array<{ level: number; msg: string; [k: string]: unknown }> {
  return worker.output().split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as { level: number; msg: string });
}

describe('worker faults', () => {
  let env: FleetEnv | undefined;
  let workers: WorkerProcess[] = [];
  const dirs: string[] = [];

  const batches: string[] = [];

  afterEach(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    // Sandboxes of killed workers that no reaper took (the test failed before): not left to the next run.
    for (const batchId of batches.splice(0)) {
      for (const c of await fleetContainers('batch', batchId)) await docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined);
    }
    workers = [];
    await env?.close();
    env = undefined;
    await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
  });

  /** A fleet on a Redis that keeps its folder, so it can be killed and started again on its port. */
  async function restartableFleet(): Promise<FleetEnv> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-redis-'));
    dirs.push(dir);
    env = await fleetEnvOn(await startPrivateRedis({ durable: true, dir }));
    return env;
  }

  async function restartRedis(fleet: FleetEnv): Promise<void> {
    fleet.redis = await startPrivateRedis({ durable: true, dir: fleet.redis.dir, port: fleet.redis.port });
  }

  it('SIGTERM while Redis is down: the worker exits within its drain timeout', async () => {
    const fleet = await restartableFleet();
    const drainTimeoutMs = 2_000;
    const worker = spawnWorker({ ...fleet.env, FLEET_DRAIN_TIMEOUT_MS: String(drainTimeoutMs) }, 'stranded');
    workers.push(worker);
    await waitFor('the worker to hold its lease', async () => (await fleet.client.exists(leaseKey(fleet.prefix, 'stranded'))) === 1, 30_000);
    await killRedis(fleet.redis);
    await waitFor('the worker to notice', async () => /ECONNREFUSED|ECONNRESET|Connection is closed|redis connection lost/.test(worker.output()), 30_000);

    const exited = once(worker.child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    const sigterm = Date.now();
    worker.child.kill('SIGTERM');
    // Bounded here, so a worker that hangs fails the test instead of the test timing out.
    const bound = drainTimeoutMs + 8_000;
    const outcome = await Promise.race([exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), bound).unref())]);
    const tookMs = Date.now() - sigterm;
    if (outcome === 'hung') worker.child.kill('SIGKILL');
    expect(outcome, `still running ${bound} ms after SIGTERM:\n${worker.output().slice(-2000)}`).not.toBe('hung');
    // No episode was running: nothing to hand back, so a clean exit.
    expect(outcome).toEqual([0, null]);
    expect(tookMs).toBeLessThan(bound);
    await restartRedis(fleet);
  });

  it('SIGTERM while Redis is down with an episode running: exits at the deadline, code 5 (not handed back)', async () => {
    const fleet = await restartableFleet();
    const drainTimeoutMs = 1_000;
    const worker = spawnWorker({ ...fleet.env, FLEET_DRAIN_TIMEOUT_MS: String(drainTimeoutMs) }, 'stranded-busy', 1);
    workers.push(worker);
    const plan = await enqueueFile(fleet, await sleepyBatch(1, 60));
    batches.push(plan.batchId);
    await waitFor('the agent to run', async () => {
      const mine = (await fleetContainers('worker', 'stranded-busy')).filter((c) => c.State === 'running');
      return (await Promise.all(mine.map((c) => sandboxHasFile(c.Id, '/workspace/started')))).some(Boolean);
    }, 60_000, 200);
    await killRedis(fleet.redis);
    const exited = once(worker.child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    worker.child.kill('SIGTERM');
    // Drain timeout + the 5 s close grace + a margin for a loaded host.
    const bound = drainTimeoutMs + 5_000 + 5_000;
    const outcome = await Promise.race([exited, new Promise<'hung'>((r) => setTimeout(() => r('hung'), bound).unref())]);
    if (outcome === 'hung') worker.child.kill('SIGKILL');
    expect(outcome, worker.output().slice(-2000)).toEqual([5, null]);
    expect(worker.output()).toMatch(/close deadline passed: connections cut/);
    await restartRedis(fleet);
  });

  it('a Redis outage is logged once per connection, then its recovery with a count', async () => {
    const fleet = await restartableFleet();
    const worker = spawnWorker({ ...fleet.env, LOG_LEVEL: 'warn' }, 'noisy');
    workers.push(worker);
    await waitFor('the worker to hold its lease', async () => (await fleet.client.exists(leaseKey(fleet.prefix, 'noisy'))) === 1, 30_000);
    const before = logLines(worker).length;
    await killRedis(fleet.redis);
    // An outage of several seconds: ioredis retries every ~50-2000 ms on each connection meanwhile.
    const downAt = Date.now();
    await waitFor('the worker to notice', async () => logLines(worker).length > before, 30_000);
    await waitFor('5 s of outage', async () => Date.now() - downAt > 5_000, 10_000, 200);
    await restartRedis(fleet);
    await waitFor('the recovery to be logged', async () => logLines(worker).some((l) => l.msg === 'redis connection recovered'), 30_000);
    await waitFor('the lease to be renewed', async () => (await fleet.client.exists(leaseKey(fleet.prefix, 'noisy'))) === 1, 30_000);
    const lines = logLines(worker).slice(before);
    // One "lost" and one "recovered" per connection (the worker has a handful), nothing per retry.
    expect(lines.length, lines.map((l) => l.msg).join('\n')).toBeLessThanOrEqual(16);
    const recovered = lines.filter((l) => l.msg === 'redis connection recovered');
    expect(recovered.length).toBeGreaterThan(0);
    for (const r of recovered) expect(r.failures).toEqual(expect.any(Number));
    expect(await worker.stop()).toBe(0);
  });

  it('an episode whose worker is killed -9 twice still ends with its real result (stalls use the infra budget)', async () => {
    const fleet = await restartableFleet();
    // Short locks, leases and reaper interval, so each stall is noticed and its sandbox reaped in seconds.
    const fast = { ...fleet.env, FLEET_LOCK_DURATION_MS: '2000', FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '2000' };
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "touch started; sleep 4; echo fixed > state.txt" }\n', {
      slow: {
        // A unique instruction, so the batch id (a digest of the batch) is this run's own.
        yaml: `id: slow\ninstruction: write fixed into state.txt (${randomBytes(4).toString('hex')})\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\n`,
        files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
      },
    });
    const plan = await enqueueFile(fleet, file);
    batches.push(plan.batchId);
    const episodeId = plan.jobs[0]!.episodeId;
    /** Wait until the episode's agent runs in a sandbox of `workerId`. */
    const agentRunsOn = (workerId: string) => waitFor(`the agent to run on ${workerId}`, async () => {
      const mine = (await fleetContainers('worker', workerId)).filter((c) => c.State === 'running' && c.Labels['rollout-fleet.episode'] === episodeId);
      return (await Promise.all(mine.map((c) => sandboxHasFile(c.Id, '/workspace/started')))).some(Boolean);
    }, 90_000, 200);

    // Default infra budget (2): two workers die mid-episode; the third one finishes it.
    for (const id of ['doomed-1', 'doomed-2']) {
      const doomed = spawnWorker(fast, id, 1);
      workers.push(doomed);
      await agentRunsOn(id);
      await killWorker(doomed);
    }
    workers.push(spawnWorker(fast, 'survivor', 1));
    const [result] = await waitForResults(fleet, plan.batchId, 1, 120_000);
    const { status, reward, workerId, attempts, error } = result!;
    expect({ status, reward, workerId, attempts, error }).toEqual({ status: 'passed', reward: 1, workerId: 'survivor', attempts: 3, error: undefined });
    await waitForNoContainers(plan.batchId, 60_000);
  });

  /** A batch of `samples` episodes whose agent takes `agentSec`; unique per call (its own batch id). */
  async function sleepyBatch(samples: number, agentSec: number): Promise<string> {
    return writeBatch(`tasks: [tasks]\nsamples: ${samples}\nagent: { kind: command, command: "touch started; sleep ${agentSec}; echo fixed > state.txt" }\n`, {
      sleepy: {
        yaml: `id: sleepy\ninstruction: write fixed (${randomBytes(4).toString('hex')})\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\n`,
        files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
      },
    });
  }

  it('enqueue --wait survives a Redis restart mid-batch and exits 0 with the summary', async () => {
    const fleet = await restartableFleet();
    workers.push(spawnWorker(fleet.env, 'steady', 2));
    const samples = 4;
    const file = await sleepyBatch(samples, 3);
    const enqueue = spawn(process.execPath, [BIN, 'enqueue', file, '--wait', '--json', '--timeout-ms', '180000'], { env: fleet.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    enqueue.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
    enqueue.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const closed = once(enqueue, 'close') as Promise<[number | null]>;
    // Mid-batch: the batch is enqueued (enqueue is waiting) and episodes run.
    await waitFor('episodes to be running', async () => (await fleet.episodes.getActiveCount()) >= 1, 60_000);
    const batchId = (await fleet.results.listBatches())[0]!;
    batches.push(batchId);
    await killRedis(fleet.redis);
    // Down long enough for several of the --wait polls (every 500 ms) to fail.
    const downAt = Date.now();
    await waitFor('2 s of outage', async () => Date.now() - downAt > 2_000, 10_000, 100);
    await restartRedis(fleet);
    const [code] = await closed;
    expect(code, stderr).toBe(0);
    const summary = JSON.parse(stdout) as { batchId: string; total: number; done: number; finished: boolean };
    expect(summary).toMatchObject({ batchId, total: samples, done: samples, finished: true });
    expect(stderr).toMatch(/Redis connection lost/);
    expect(stderr).toMatch(/Redis connection recovered/);
  });

  it('the running count leaves out jobs of killed workers that are still listed active', async () => {
    const fleet = await restartableFleet();
    // Short locks: a killed worker's jobs lose their lock in 2 s; no other worker declares them stalled.
    const doomed = spawnWorker({ ...fleet.env, FLEET_LOCK_DURATION_MS: '2000' }, 'counted', 2);
    workers.push(doomed);
    const plan = await enqueueFile(fleet, await sleepyBatch(2, 30));
    batches.push(plan.batchId);
    await waitFor('both episodes to run', async () => (await runningEpisodes(fleet.episodes, fleet.client, plan.batchId)) === 2, 60_000);
    await killWorker(doomed);
    await waitFor('the killed worker\'s jobs to lose their locks', async () => (await runningEpisodes(fleet.episodes, fleet.client, plan.batchId)) === 0, 10_000);
    // Still listed active (only a live worker's stall check moves them), but nobody runs them.
    expect(await fleet.episodes.getActiveCount()).toBe(2);
  });
});
