// Operations on real processes: a worker started before Redis waits and connects once Redis is up,
// and a Redis that is killed (kill -9) mid-batch and restarted on the same port and AOF folder loses
// nothing: every episode ends with exactly one result.
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { freePort, startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import {
  fleetEnvOn, spawnWorker, waitFor, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess,
  enqueueFile,
} from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

/** A task the command agent solves after `agentSec` seconds. */
async function batchFile(name: string, samples: number, agentSec: number): Promise<string> {
  return writeBatch(`name: ${name}\ntasks: [tasks]\nsamples: ${samples}\nagent: { kind: command, command: "sleep ${agentSec}; echo fixed > state.txt" }\n`, {
    fix: {
      yaml: 'id: fix\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 30, verifySec: 20, closeSec: 20 }\n',
      files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
    },
  });
}


describe('redis outages', () => {
  let env: FleetEnv | undefined;
  let workers: WorkerProcess[] = [];
  const dirs: string[] = [];

  afterEach(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    workers = [];
    await env?.close();
    env = undefined;
    await Promise.all(dirs.splice(0).map((d) => rm(d, { recursive: true, force: true })));
  });

  it('a worker started before Redis is up waits, connects and runs the batch', async () => {
    const port = await freePort();
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-data-'));
    dirs.push(dataDir);
    const prefix = `t${Date.now().toString(36)}`;
    const worker = spawnWorker(
      { ...process.env, REDIS_URL: `redis://127.0.0.1:${port}`, FLEET_PREFIX: prefix, FLEET_DATA_DIR: dataDir, LOG_LEVEL: 'warn' },
      'early-w',
    );
    workers.push(worker);
    // It is running and has tried Redis, in vain.
    await waitFor('the worker to find Redis down', async () => /ECONNREFUSED/.test(worker.output()), 30_000);
    expect(worker.child.exitCode).toBeNull();

    // The worker's prefix and data folder, so it and the test see the same keys and files.
    env = await fleetEnvOn(await startPrivateRedis({ port }), { prefix, dataDir });

    const plan = await enqueueFile(env, await batchFile('early', 2, 0));
    const results = await waitForResults(env, plan.batchId, 2);
    expect(results.map((r) => [r.status, r.reward, r.workerId])).toEqual([['passed', 1, 'early-w'], ['passed', 1, 'early-w']]);
    await waitForNoContainers(plan.batchId);
    expect(await worker.stop()).toBe(0);
  });

  it('survives Redis being killed mid-batch and restarted with its AOF: nothing is lost', async () => {
    const redisDir = await mkdtemp(path.join(os.tmpdir(), 'rf-redis-aof-'));
    dirs.push(redisDir);
    let redis: PrivateRedis = await startPrivateRedis({ durable: true, dir: redisDir });
    env = await fleetEnvOn(redis);
    const fleet = env;
    workers = [spawnWorker(fleet.env, 'outage-w1'), spawnWorker(fleet.env, 'outage-w2')];
    const samples = 6;
    const plan = await enqueueFile(fleet, await batchFile('outage', samples, 3));

    // Mid-batch: episodes are running in sandboxes, none has finished.
    await waitFor('episodes to be running', async () => (await fleet.episodes.getActiveCount()) >= 2, 60_000);
    expect(await fleet.results.resultCount(plan.batchId)).toBe(0);
    const exited = new Promise((resolve) => redis.process.once('exit', resolve));
    redis.process.kill('SIGKILL');
    await exited;
    await waitFor('a worker to notice', async () => workers.some((w) => /ECONNREFUSED|ECONNRESET|Connection is closed/.test(w.output())), 30_000);

    redis = await startPrivateRedis({ durable: true, dir: redisDir, port: redis.port });
    fleet.redis = redis;
    const results = await waitForResults(fleet, plan.batchId, samples, 120_000);
    expect(results).toHaveLength(samples);
    expect(new Set(results.map((r) => r.episodeId)).size).toBe(samples);
    for (const r of results) expect([r.status, r.reward], `${r.episodeId}: ${JSON.stringify(r.error)}`).toEqual(['passed', 1]);
    // Every job ended completed; none is left waiting, active or failed.
    await waitFor('every job completed', async () => (await fleet.episodes.getJobCounts('completed')).completed === samples, 30_000);
    expect(await fleet.episodes.getJobCounts('waiting', 'active', 'delayed', 'failed')).toEqual({ waiting: 0, active: 0, delayed: 0, failed: 0 });
    await waitForNoContainers(plan.batchId);
    expect(await Promise.all(workers.map((w) => w.stop()))).toEqual([0, 0]);
    // The workers released every connection, the reconnected ones included; only the test's own is left.
    expect(((await fleet.client.client('LIST')) as string).trim().split('\n')).toHaveLength(1);
  });
});
