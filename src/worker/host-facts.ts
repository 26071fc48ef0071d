// Per-host facts in one place: each worker reports, every few seconds and with a TTL (a dead worker's
// facts vanish with it), its host name, Docker engine id, runtime generation, the images its engine
// has, the free disk of its data folder, its admission control (allowance, engine latency); and the
// episodes it runs (phase, start) and its warm sandboxes, also reported within a moment of changing
// (touch). The dashboard shows the fleet by host from these; enqueue checks that some live host has
// each task's image.
import { statfs } from 'node:fs/promises';
import os from 'node:os';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { z } from 'zod';
import { workerFactsKey } from '../redis/redis-keys.ts';
import { dockerCall, engineId, type Docker } from '../sandbox/docker-client.ts';
import { EPISODE_PHASES, type RunningEpisode } from '../episode/running-episodes.ts';
import type { AdmissionSnapshot } from './admission.ts';
import type { BudgetSnapshot } from '../episode/resource-budget.ts';

export const RunningEpisodeFacts = z.object({
  episodeId: z.string(),
  batchId: z.string(),
  taskId: z.string(),
  phase: z.enum(EPISODE_PHASES),
  startedAt: z.iso.datetime(),
  phaseStartedAt: z.iso.datetime(),
});
export type RunningEpisodeFacts = z.infer<typeof RunningEpisodeFacts>;

/** A worker's admission control as reported (src/worker/admission.ts): numbers of its last window. */
export const AdmissionFacts = z.object({
  autotune: z.boolean(),
  /** Episodes it may run at once now. */
  allowance: z.number().int(),
  floor: z.number().int(),
  /** Episodes running at the last sample. */
  inUse: z.number().int(),
  increases: z.number().int(),
  decreases: z.number().int(),
  /** p50 and p90 latency of the watched engine calls in the last window that had some, in ms. */
  engineP50Ms: z.number().optional(),
  engineP90Ms: z.number().optional(),
  /** The watched calls' time over their baselines' (their latency at the least load seen), in the same window. */
  engineSlowdown: z.number().optional(),
  /** Docker calls that timed out in the last window. */
  engineTimeouts: z.number().int(),
  loadPerCore: z.number().optional(),
});
export type AdmissionFacts = z.infer<typeof AdmissionFacts>;

/** What the running episodes' environments take of the worker's budget (src/episode/resource-budget.ts). */
export const BudgetFacts = z.object({
  /** The budget: MiB, and CPUs when counted. */
  memoryMb: z.number().optional(),
  cpus: z.number().optional(),
  usedMemoryMb: z.number(),
  usedCpus: z.number(),
  /** Containers of the running environments. */
  containers: z.number().int(),
  /** Episodes waiting for room. */
  waiting: z.number().int(),
});
export type BudgetFacts = z.infer<typeof BudgetFacts>;

export const WorkerFacts = z.object({
  workerId: z.string(),
  host: z.string(),
  engineId: z.string(),
  pid: z.number().int(),
  /** Configured concurrency (with autotune, the ceiling of the allowance). */
  concurrency: z.number().int(),
  /** Absent from workers of versions without it. */
  admission: AdmissionFacts.optional(),
  /** Absent from workers of versions without it. */
  budget: BudgetFacts.optional(),
  /** The runtime generation prepared on this engine, once it is. */
  runtimeGeneration: z.string().optional(),
  /** Image references (repo:tag) and ids the engine has. */
  images: z.array(z.string()),
  /** Free bytes of the file system of the worker's data folder. */
  freeDiskBytes: z.number(),
  reportedAt: z.iso.datetime(),
  /** The episodes running now (absent from workers of earlier versions). */
  running: z.array(RunningEpisodeFacts).optional(),
  /** Warm sandboxes ready in the worker's pool. */
  poolReady: z.number().int().optional(),
  /** The prepare queue of its engine, once it takes its jobs (absent: a worker of a version before it, or one not knowing its engine yet). */
  prepareQueue: z.string().optional(),
  /** The names of the model endpoints it has (absent from workers of versions before the endpoint table). */
  modelEndpoints: z.array(z.string()).optional(),
});
export type WorkerFacts = z.infer<typeof WorkerFacts>;

export interface HostFactsOptions {
  redis: Redis;
  prefix: string;
  docker: Docker;
  workerId: string;
  concurrency: number;
  dataDir: string;
  /** Facts expire this long after the last report (the lease's TTL). */
  ttlMs: number;
  callTimeoutMs: number;
  runtimeGeneration: () => string | undefined;
  /** The episodes running now. @default none reported */
  running?: () => RunningEpisode[];
  /** Warm sandboxes ready now. @default none reported */
  poolReady?: () => number;
  /** The worker's admission control now. */
  admission?: () => AdmissionSnapshot & { autotune: boolean };
  /** The prepare queue this worker takes, once it does. */
  prepareQueue?: () => string | undefined;
  /** The names of the model endpoints this worker has (its endpoint table). */
  modelEndpoints?: readonly string[];
  /** What the running environments take of the worker's budget. */
  budget?: () => BudgetSnapshot;
  log: Logger;
  /** touch() writes at most this often. @default 500 */
  touchEveryMs?: number;
}

function admissionFacts(s: AdmissionSnapshot & { autotune: boolean }): AdmissionFacts {
  const l = s.latency;
  return {
    autotune: s.autotune, allowance: s.allowance, floor: s.floor, inUse: s.inUse, increases: s.increases, decreases: s.decreases,
    ...(l !== undefined && { engineP50Ms: Math.round(l.p50Ms * 10) / 10, engineP90Ms: Math.round(l.p90Ms * 10) / 10 }),
    ...(l?.slowdown !== undefined && { engineSlowdown: Math.round(l.slowdown * 100) / 100 }),
    engineTimeouts: s.window?.timeouts ?? 0,
    ...(s.window?.loadPerCore !== undefined && { loadPerCore: Math.round(s.window.loadPerCore * 100) / 100 }),
  };
}

export interface HostFactsReporter {
  /** Report now (also done every ttl/3). */
  report(): Promise<void>;
  /**
   * The running episodes or the pool changed: write the facts again soon (within touchEveryMs), with
   * the engine facts of the last report, so a change shows without asking the engine again.
   */
  touch(): void;
  stop(): Promise<void>;
}

const iso = (ms: number) => new Date(ms).toISOString();

/** What changes from one moment to the next: the running episodes and the warm sandboxes. */
function liveFacts(opts: HostFactsOptions): Pick<WorkerFacts, 'running' | 'poolReady' | 'reportedAt' | 'prepareQueue' | 'budget'> {
  const prepareQueue = opts.prepareQueue?.();
  const budget = opts.budget?.();
  return {
    ...(prepareQueue !== undefined && { prepareQueue }),
    ...(budget !== undefined && {
      budget: {
        ...(budget.limits.memoryMb !== undefined && { memoryMb: budget.limits.memoryMb }),
        ...(budget.limits.cpus !== undefined && { cpus: budget.limits.cpus }),
        usedMemoryMb: budget.used.memoryMb, usedCpus: budget.used.cpus, containers: budget.used.containers, waiting: budget.waiting,
      },
    }),
    ...(opts.running && {
      running: opts.running().map((e) => ({
        episodeId: e.episodeId, batchId: e.batchId, taskId: e.taskId, phase: e.phase, startedAt: iso(e.startedAt), phaseStartedAt: iso(e.phaseStartedAt),
      })),
    }),
    ...(opts.poolReady && { poolReady: opts.poolReady() }),
    reportedAt: new Date().toISOString(),
  };
}

async function gather(opts: HostFactsOptions): Promise<WorkerFacts> {
  const call = { timeoutMs: opts.callTimeoutMs };
  const [engine, images, disk] = await Promise.all([
    engineId(opts.docker, call),
    dockerCall('list images', call, (abortSignal) => opts.docker.listImages({ abortSignal } as object)),
    statfs(opts.dataDir).catch(() => undefined),
  ]);
  const generation = opts.runtimeGeneration();
  return {
    workerId: opts.workerId,
    host: os.hostname(),
    engineId: engine,
    pid: process.pid,
    concurrency: opts.concurrency,
    ...(opts.admission && { admission: admissionFacts(opts.admission()) }),
    ...(generation !== undefined && { runtimeGeneration: generation }),
    ...(opts.modelEndpoints !== undefined && { modelEndpoints: [...opts.modelEndpoints] }),
    images: [...new Set(images.flatMap((i) => [...(i.RepoTags ?? []).filter((t) => t !== '<none>:<none>'), i.Id]))].sort(),
    freeDiskBytes: disk ? disk.bavail * disk.bsize : -1,
    ...liveFacts(opts),
  };
}

export function startHostFacts(opts: HostFactsOptions): HostFactsReporter {
  const key = workerFactsKey(opts.prefix, opts.workerId);
  const touchEveryMs = opts.touchEveryMs ?? 500;
  let stopped = false;
  let last: WorkerFacts | undefined;
  let reporting: Promise<void> | undefined;
  let writing: Promise<void> | undefined;
  const report = () => {
    reporting ??= gather(opts)
      .then((facts) => {
        last = facts;
        // Built at the time of writing: a touch during the gathering is not overwritten by older facts.
        return stopped ? undefined : opts.redis.set(key, JSON.stringify({ ...facts, ...liveFacts(opts) }), 'PX', opts.ttlMs);
      })
      .then(() => undefined, (err: unknown) => opts.log.warn({ err: String(err) }, 'host facts not reported'))
      .finally(() => (reporting = undefined));
    return reporting;
  };
  let touchTimer: NodeJS.Timeout | undefined;
  let lastTouch = 0;
  const touch = () => {
    if (stopped || touchTimer !== undefined) return;
    touchTimer = setTimeout(() => {
      touchTimer = undefined;
      lastTouch = Date.now();
      // Before the first report there is nothing to refresh: the first report carries the live facts.
      if (last === undefined || stopped) return;
      writing = opts.redis.set(key, JSON.stringify({ ...last, ...liveFacts(opts) }), 'PX', opts.ttlMs)
        .then(() => undefined, (err: unknown) => opts.log.debug({ err: String(err) }, 'running episodes not reported'));
    }, Math.max(0, lastTouch + touchEveryMs - Date.now()));
    touchTimer.unref();
  };
  const timer = setInterval(() => void report(), Math.max(1_000, Math.floor(opts.ttlMs / 3)));
  timer.unref();
  void report();
  return {
    report,
    touch,
    async stop() {
      stopped = true;
      clearInterval(timer);
      clearTimeout(touchTimer);
      await Promise.all([reporting, writing]);
      await opts.redis.del(key).catch(() => undefined);
    },
  };
}

/** The facts of every live worker, by worker id order. */
export async function readHostFacts(redis: Redis, prefix: string): Promise<WorkerFacts[]> {
  const keys: string[] = [];
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', workerFactsKey(prefix, '*'), 'COUNT', 500);
    keys.push(...found);
    cursor = next;
  } while (cursor !== '0');
  if (keys.length === 0) return [];
  const values = await redis.mget(...keys);
  return values.flatMap((v) => {
    const parsed = v === null ? undefined : WorkerFacts.safeParse(JSON.parse(v));
    return parsed?.success ? [parsed.data] : [];
  }).sort((a, b) => a.workerId.localeCompare(b.workerId));
}

/**
 * Whether some live worker has the model endpoint `name`; undefined when it cannot be told (no live
 * worker, or none of a version that reports its endpoints).
 */
export function endpointOnSomeWorker(facts: readonly WorkerFacts[], name: string): boolean | undefined {
  const reporting = facts.filter((f) => f.modelEndpoints !== undefined);
  if (reporting.length === 0) return undefined;
  return reporting.some((f) => f.modelEndpoints!.includes(name));
}

/** Whether some live worker's engine has `image` (by reference or id); undefined when no worker reports facts. */
export function imageOnSomeHost(facts: readonly WorkerFacts[], image: string): boolean | undefined {
  if (facts.length === 0) return undefined;
  const withTag = image.includes(':') || image.includes('@') ? image : `${image}:latest`;
  return facts.some((f) => f.images.includes(image) || f.images.includes(withTag));
}
