// Test fixtures on real services: a private redis-server per test file, a unique key prefix and data
// folder per test, worker processes started through the real CLI, and checks that nothing leaked.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { FlowProducer, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { EPISODES_QUEUE } from '../../queues/episodes/contract.ts';
import { CLEANUP_QUEUE } from '../../queues/cleanup/contract.ts';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import { createDocker, type Docker } from '../../src/sandbox/docker-client.ts';
import { enqueueBatch } from '../../src/producer/enqueue-batch.ts';
import { loadBatch } from '../../src/tasks/load-task.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { ResultsStore } from '../../src/results/results-store.ts';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { writeBatch } from './scratch-tasks.ts';
import { startWorker, type WorkerHandle, type WorkerOptions } from '../../src/worker/start-worker.ts';

export const ROOT = fileURLToPath(new URL('../..', import.meta.url));
/** The compiled CLI, as installed (test/helpers/build-dist.ts brings it up to date). */
export const BIN = path.join(ROOT, 'dist/src/cli/bin.js');
export const EXAMPLES = path.join(ROOT, 'examples');
export const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
export const silentLog = pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' });
/**
 * The suite's workers share one patched node (FLEET_RUNTIME_CACHE) and one runtime volume per
 * generation (FLEET_RUNTIME_SCOPE), installed once before any file (test/helpers/shared-runtime.ts),
 * instead of a 95 MB copy per data folder and an install per prefix. Kept between runs.
 */
export const SHARED_RUNTIME_CACHE = path.join(os.tmpdir(), 'rf-test-runtime-cache');
export const SHARED_RUNTIME_SCOPE = 'rf-test-shared';

/** Poll `check` until it returns a truthy value; fail with `what` after `timeoutMs`. */
export async function waitFor<T>(what: string, check: () => Promise<T | undefined | false>, timeoutMs = 60_000, everyMs = 100): Promise<T> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > until) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export interface FleetEnv {
  redis: PrivateRedis;
  /** A connection for the test itself. */
  client: Redis;
  prefix: string;
  dataDir: string;
  env: NodeJS.ProcessEnv;
  episodes: Queue;
  cleanup: Queue;
  flows: FlowProducer;
  results: ResultsStore;
  close(): Promise<void>;
}

/**
 * Remove a test data folder's runtime inputs cache (a patched copy of node, about 95 MB): every worker
 * with a fresh data folder makes one, and left behind they fill the disk over repeated runs. The
 * evidence and results stay for a look after a failure.
 */
export async function dropRuntimeCache(dataDir: string): Promise<void> {
  await rm(path.join(dataDir, 'runtime-src'), { recursive: true, force: true });
}

/** A private Redis, a unique prefix and data folder; one per test file (or test). */
export async function startFleetEnv(opts: { durable?: boolean } = {}): Promise<FleetEnv> {
  return fleetEnvOn(await startPrivateRedis(opts));
}

/** A unique prefix and data folder on a Redis already started; close() stops that Redis. */
export async function fleetEnvOn(redis: PrivateRedis, opts: { prefix?: string; dataDir?: string } = {}): Promise<FleetEnv> {
  const client = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-test' });
  // A test that restarts Redis expects this connection to fail for a while.
  client.on('error', () => undefined);
  const prefix = opts.prefix ?? `t${randomBytes(4).toString('hex')}`;
  const dataDir = opts.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), 'rf-data-')));
  // Workers started from this env keep no warm sandboxes unless a test asks (test/integration/sandbox-pool.test.ts):
  // a claimed warm sandbox carries no episode or batch label, which many tests find sandboxes by. Nor
  // do they tune their concurrency (test/integration/admission.test.ts does): under the suite's load the
  // engine is slow enough to be cut to one episode at a time, and tests count on the slots they asked for.
  const env = {
    ...process.env, REDIS_URL: redis.url, FLEET_PREFIX: prefix, FLEET_DATA_DIR: dataDir, FLEET_SANDBOX_POOL: '0', FLEET_WORKER_AUTOTUNE: 'false',
    FLEET_RUNTIME_CACHE: SHARED_RUNTIME_CACHE, FLEET_RUNTIME_SCOPE: SHARED_RUNTIME_SCOPE,
    LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'warn',
  };
  const episodes = new Queue(EPISODES_QUEUE, { connection: client, prefix });
  const cleanup = new Queue(CLEANUP_QUEUE, { connection: client, prefix });
  const flows = new FlowProducer({ connection: client, prefix });
  for (const q of [episodes, cleanup]) q.on('error', () => undefined);
  const fleetEnv: FleetEnv = {
    redis,
    client,
    prefix,
    dataDir,
    env,
    episodes,
    cleanup,
    flows,
    results: new ResultsStore(client, prefix, dataDir),
    async close() {
      await episodes.close();
      await cleanup.close();
      await flows.close();
      await client.quit();
      // Sandboxes whose cleanup jobs no worker of this test is left to run (an episode cancelled during
      // set-up, just before the test ended): in a fleet the reaper takes them; here nobody would.
      const left = await docker.listContainers({ all: true, filters: { label: [`${LABEL.fleet}=${prefix}`] } });
      await Promise.all(left.map((c) => docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined)));
      // Runtime generations a worker installed for this prefix (one started without the shared scope).
      const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.prefix}=${prefix}`] } });
      await Promise.all((Volumes ?? []).map((v) => docker.getVolume(v.Name).remove().catch(() => undefined)));
      // Prepared images this prefix made (unforced: one a sandbox of another test uses stays; a process that remembers one makes it again).
      const prepared = await docker.listImages({ filters: { label: [`${LABEL.preparedPrefix}=${prefix}`] } });
      await Promise.all(prepared.map((i) => docker.getImage(i.Id).remove().catch(() => undefined)));
      // env.redis, not the first one: a test may have restarted Redis on the same port.
      await fleetEnv.redis.stop();
      await dropRuntimeCache(dataDir);
    },
  };
  return fleetEnv;
}

export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Run the real CLI to completion. */
export async function runCli(args: string[], env: NodeJS.ProcessEnv, timeoutMs = 120_000): Promise<CliRun> {
  const child = spawn(process.execPath, [BIN, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  // A command that never exits fails the test, naming itself and what it printed, instead of hanging it.
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
  clearTimeout(timer);
  if (code === null && signal === 'SIGKILL') {
    throw new Error(`rollout-fleet ${args[0]} did not exit within ${timeoutMs} ms\nstdout: ${stdout.slice(-2000)}\nstderr: ${stderr.slice(-4000)}`);
  }
  return { code, stdout, stderr };
}

export interface WorkerProcess {
  child: ChildProcess;
  output(): string;
  /** SIGTERM and wait for the exit code. */
  stop(): Promise<number | null>;
}

/** Start `rollout-fleet worker` as its own process. */
export function spawnWorker(env: NodeJS.ProcessEnv, workerId: string, concurrency = 2): WorkerProcess {
  const child = spawn(process.execPath, [BIN, 'worker', '--concurrency', String(concurrency)], {
    env: { ...env, FLEET_WORKER_ID: workerId },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out += d.toString()));
  return {
    child,
    output: () => out,
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
      child.kill('SIGTERM');
      const [code] = (await once(child, 'close')) as [number | null];
      return code;
    },
  };
}

/** Containers carrying a fleet label value, running or not. */
export async function fleetContainers(label: keyof typeof LABEL, value: string, engine: Docker = docker) {
  return engine.listContainers({ all: true, filters: { label: [`${LABEL[label]}=${value}`] } });
}

/** Wait until the batch has a result for every episode. */
export async function waitForResults(env: FleetEnv, batchId: string, total: number, timeoutMs = 90_000) {
  return waitFor(`${total} results of ${batchId}`, async () => {
    const results = await env.results.results(batchId);
    return results.length >= total ? results : undefined;
  }, timeoutMs, 200);
}

/** Wait until no container of the batch is left (the cleanup queue removed them). */
export async function waitForNoContainers(batchId: string, timeoutMs = 30_000): Promise<void> {
  await waitFor(`no containers of ${batchId}`, async () => (await fleetContainers('batch', batchId)).length === 0, timeoutMs, 200);
}

/** Whether a running container has a file (the agent got that far). */
export async function sandboxHasFile(containerId: string, file: string, engine: Docker = docker): Promise<boolean> {
  return engine.getContainer(containerId).getArchive({ path: file }).then((s) => {
    (s as unknown as NodeJS.ReadableStream).resume();
    return true;
  }, () => false);
}

/** Wait until `count` running sandboxes carrying the label have written `file`. */
export async function waitForSandboxFile(label: keyof typeof LABEL, value: string, file: string, count = 1, timeoutMs = 60_000, engine: Docker = docker): Promise<void> {
  await waitFor(`${count} sandbox(es) with ${label}=${value} to have ${file}`, async () => {
    const running = (await fleetContainers(label, value, engine)).filter((c) => c.State === 'running');
    const has = await Promise.all(running.map((c) => sandboxHasFile(c.Id, file, engine)));
    return has.filter(Boolean).length >= count;
  }, timeoutMs, 200);
}

/** A worker in this process on the env's Redis, prefix and data folder; `overrides` win. */
export function startEnvWorker(env: FleetEnv, workerId: string, overrides: Partial<WorkerOptions> = {}): Promise<WorkerHandle> {
  return startWorker({
    redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir, docker, log: silentLog,
    workerId, concurrency: 2, callTimeoutMs: 30_000, outputCapBytes: 64 * 1024,
    runtimeCacheDir: SHARED_RUNTIME_CACHE, runtimeVolumeScope: SHARED_RUNTIME_SCOPE,
    ...overrides,
  });
}

/** Load a batch file and enqueue it on the env's Redis, as `rollout-fleet enqueue` does. */
export async function enqueueFile(env: FleetEnv, file: string) {
  return enqueueBatch(await loadBatch(file), { flows: env.flows, redis: env.client, prefix: env.prefix, results: env.results });
}

export interface Dashboard {
  child: ChildProcess;
  url: string;
  output(): string;
  stop(): Promise<number | null>;
}

/** `rollout-fleet dashboard` as its own process; resolves once it logged where it listens. */
export async function spawnDashboard(env: NodeJS.ProcessEnv, args: string[]): Promise<Dashboard> {
  const child = spawn(process.execPath, [BIN, 'dashboard', ...args], { env: { ...env, LOG_LEVEL: 'info' }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (out += d.toString()));
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
    child.kill('SIGTERM');
    const [code] = (await once(child, 'exit')) as [number | null];
    return code;
  };
  try {
    const url = await waitFor('the dashboard to listen', async () => {
      if (child.exitCode !== null) throw new Error(`dashboard exited ${child.exitCode}: ${out}`);
      return /"url":"(http:[^"]+)".*"msg":"dashboard listening"/.exec(out)?.[1];
    }, 30_000, 50);
    return { child, url, output: () => out, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * Run the task folders `tasks` (or folders of them) with `agent` (the batch file's YAML for it): enqueue,
 * wait for every result and for no container of the batch left; the results by task id (one sample each).
 */
export async function runTaskFolders(env: FleetEnv, tasks: string[], agent: string): Promise<Map<string, EpisodeResult>> {
  const plan = await enqueueFile(env, await writeBatch(`tasks: ${JSON.stringify(tasks)}\nagent: ${agent}\n`, {}));
  const results = await waitForResults(env, plan.batchId, plan.jobs.length, 600_000);
  await waitForNoContainers(plan.batchId);
  return new Map(results.map((r) => [r.taskId, r]));
}
