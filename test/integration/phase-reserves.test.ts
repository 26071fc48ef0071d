// Issue 9 from outside: every phase of an episode (set-up, agent, verify, close) ends within its
// reserve plus one second whatever the resource it waits on does (Redis paused, a Docker call hung,
// a model that never answers), and the episode ends as the right kind. The fleet is a black box here.
import http from 'node:http';
import type net from 'node:net';
import { readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { EPISODES_QUEUE, type EpisodeResult } from '../../queues/episodes/contract.ts';
import type { WorkerHandle, WorkerOptions } from '../../src/worker/start-worker.ts';
import { bullmqEventsKey } from '../../src/redis/redis-keys.ts';
import {
  enqueueFile, fleetContainers, startEnvWorker, startFleetEnv, waitFor, waitForResults, type FleetEnv,
} from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';
import { startStallingDocker, type StallingDocker } from '../helpers/stalling-docker.ts';

/** Far longer than any reserve below (and than set-up plus close); the workers' lease and lock outlast it. */
const PAUSE_MS = 20_000;
/** Per Docker call: larger than every reserve, so only a reserve can end a hung call in time. */
const CALL_TIMEOUT_MS = 60_000;
const SLACK_MS = 1_000;

interface Reserves { setupSec: number; verifySec: number; closeSec: number }

/** One task whose verifier passes when state.txt says fixed. */
function batch(name: string, agent: string, o: { deadlineSec: number; reserves: Reserves; verifyTimeoutSec: number }) {
  const { setupSec, verifySec, closeSec } = o.reserves;
  return writeBatch(`name: ${name}\ntasks: [tasks]\nagent: ${agent}\n`, {
    [name]: {
      yaml: `id: ${name}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: ${o.verifyTimeoutSec}\n` +
        `deadlineSec: ${o.deadlineSec}\nreserves: { setupSec: ${setupSec}, verifySec: ${verifySec}, closeSec: ${closeSec} }\n`,
      files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
    },
  });
}

const SMALL: Reserves = { setupSec: 5, verifySec: 6, closeSec: 5 };
const COMMAND_AGENT = '{ kind: command, command: "echo fixed > state.txt" }';

/**
 * Resolves with Date.now() when BullMQ's event stream says the episode became active; `onActive`
 * runs synchronously in the same tick (to pause Redis right as the episode is picked up). Call it
 * after enqueueing and before a worker starts.
 */
async function watchActive(env: FleetEnv, episodeId: string, onActive?: () => void): Promise<{ at: Promise<number>; stop(): void }> {
  const conn = new Redis(env.redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-test-watch' });
  conn.on('error', () => undefined);
  const key = bullmqEventsKey(env.prefix, EPISODES_QUEUE);
  let last = (await conn.xrevrange(key, '+', '-', 'COUNT', 1))[0]?.[0] ?? '0-0';
  const at = (async () => {
    for (;;) {
      const reply = await conn.xread('BLOCK', 0, 'STREAMS', key, last);
      for (const [, entries] of reply ?? []) {
        for (const [id, fields] of entries) {
          last = id;
          const f = new Map<string, string>();
          for (let i = 0; i + 1 < fields.length; i += 2) f.set(fields[i]!, fields[i + 1]!);
          if (f.get('event') === 'active' && f.get('jobId') === episodeId) {
            onActive?.();
            return Date.now();
          }
        }
      }
    }
  })();
  at.catch(() => undefined).finally(() => conn.disconnect());
  return { at, stop: () => conn.disconnect() };
}

/** The attempt's result.json in its evidence folder, and when it was first seen. */
async function waitForAttempt(env: FleetEnv, episodeId: string, attempt: number, timeoutMs = 90_000): Promise<{ result: EpisodeResult; seenAt: number }> {
  const file = path.join(env.dataDir, 'evidence', episodeId, `attempt-${attempt}`, 'result.json');
  return waitFor(`attempt ${attempt} of ${episodeId} to end`, async () => {
    const text = await readFile(file, 'utf8').catch(() => undefined);
    if (text === undefined) return undefined;
    try {
      return { result: JSON.parse(text) as EpisodeResult, seenAt: Date.now() };
    } catch {
      return undefined; // written, not yet complete
    }
  }, timeoutMs, 50);
}

/** Pause every client of the env's Redis (reads too) for `ms`, from a connection made beforehand. */
async function redisPauser(env: FleetEnv): Promise<{ pause(ms: number): Promise<unknown>; close(): void }> {
  const conn = new Redis(env.redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-test-pause' });
  conn.on('error', () => undefined);
  await conn.ping();
  return { pause: (ms) => conn.call('CLIENT', 'PAUSE', String(ms), 'ALL'), close: () => conn.disconnect() };
}

/** The episode's one final result once the stall is over: passed (after `minAttempts`), no sandbox left. */
async function expectPassedInTheEnd(env: FleetEnv, batchId: string, minAttempts: number): Promise<void> {
  const [final] = await waitForResults(env, batchId, 1, 90_000);
  expect(final).toMatchObject({ status: 'passed', reward: 1 });
  expect(final!.attempts).toBeGreaterThanOrEqual(minAttempts);
  await waitFor('no sandbox of the batch (cleanup queue or reaper)', async () => (await fleetContainers('batch', batchId)).length === 0, 60_000, 200);
}

const secs = (ms: number | undefined) => (ms === undefined ? 'n/a' : `${(ms / 1000).toFixed(1)} s`);

describe('phase reserves (issue 9)', () => {
  let env: FleetEnv;
  let docker: StallingDocker;
  let worker: WorkerHandle | undefined;
  const cleanups: (() => Promise<void> | void)[] = [];

  const start = async (workerId: string, overrides: Partial<WorkerOptions> = {}) => {
    worker = await startEnvWorker(env, workerId, {
      docker: docker.docker, concurrency: 1, callTimeoutMs: CALL_TIMEOUT_MS, reaperIntervalMs: 1_000,
      drainTimeoutMs: 5_000, retryBudgets: { infra: 2, model: 0 }, leaseTtlMs: 60_000, lockDurationMs: 60_000, ...overrides,
    });
    return worker;
  };

  beforeAll(async () => {
    env = await startFleetEnv();
    docker = await startStallingDocker();
    // Warm the runtime generation of this prefix, so no small set-up reserve pays a cold install.
    const w = await start('warm-w');
    const plan = await enqueueFile(env, await batch('warm', COMMAND_AGENT, { deadlineSec: 300, reserves: { setupSec: 120, verifySec: 30, closeSec: 30 }, verifyTimeoutSec: 20 }));
    const [warm] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(warm).toMatchObject({ status: 'passed', reward: 1 });
    await w.close();
    worker = undefined;
  }, 180_000);

  afterEach(async () => {
    docker.releaseAll();
    docker.held.length = 0;
    docker.seen.length = 0;
    for (const c of cleanups.splice(0).reverse()) await c();
    await worker?.close();
    worker = undefined;
  });

  afterAll(async () => {
    await worker?.close();
    await docker?.close();
    await env?.close();
  });

  it('set-up with Redis paused ends within its reserve as an infra error, and nothing hangs', async () => {
    const plan = await enqueueFile(env, await batch('setup-redis', COMMAND_AGENT, { deadlineSec: 60, reserves: SMALL, verifyTimeoutSec: 5 }));
    const episodeId = plan.jobs[0]!.episodeId;
    const pauser = await redisPauser(env);
    cleanups.push(() => pauser.close());
    let paused: Promise<unknown> | undefined;
    const active = await watchActive(env, episodeId, () => (paused = pauser.pause(PAUSE_MS)));
    cleanups.push(() => active.stop());
    await start('setup-redis-w');
    const activeAt = await active.at;
    await paused;

    const { result: first, seenAt } = await waitForAttempt(env, episodeId, 1, 60_000);
    const attemptMs = seenAt - activeAt;
    console.info(`[set-up, Redis paused ${PAUSE_MS / 1000} s, setupSec ${SMALL.setupSec}, closeSec ${SMALL.closeSec}] attempt 1: ${first.status}/${first.error?.kind ?? '-'} ` +
      `(${first.error?.code ?? ''}); setupMs ${secs(first.timings.setupMs)}, closeMs ${secs(first.timings.closeMs)}, totalMs ${secs(first.timings.totalMs)}; ` +
      `active to the attempt's startedAt ${secs(Date.parse(first.startedAt) - activeAt)}; active to result.json ${secs(attemptMs)}`);
    // From outside: the set-up and the close after it are over within their two reserves.
    expect.soft(attemptMs, 'job active to attempt-1/result.json (ms)').toBeLessThanOrEqual((SMALL.setupSec + SMALL.closeSec) * 1000 + SLACK_MS);
    expect.soft(first).toMatchObject({ status: 'error', reward: null, error: { kind: 'infra' } });
    if (first.timings.setupMs !== undefined) expect.soft(first.timings.setupMs).toBeLessThanOrEqual(SMALL.setupSec * 1000 + SLACK_MS);

    // Once Redis answers again the retry runs and passes; no sandbox is left behind.
    await expectPassedInTheEnd(env, plan.batchId, 2);
  });

  it('set-up with the container create hung ends within its reserve as an infra error', async () => {
    const plan = await enqueueFile(env, await batch('setup-docker', COMMAND_AGENT, { deadlineSec: 60, reserves: SMALL, verifyTimeoutSec: 5 }));
    const episodeId = plan.jobs[0]!.episodeId;
    docker.hold((method, p) => method === 'POST' && p.startsWith('/containers/create'));
    const active = await watchActive(env, episodeId);
    cleanups.push(() => active.stop());
    await start('setup-docker-w');
    const activeAt = await active.at;

    const { result: first, seenAt } = await waitForAttempt(env, episodeId, 1, 90_000);
    const held = docker.held[0];
    const attemptMs = seenAt - activeAt;
    console.info(`[set-up, POST /containers/create held, callTimeoutMs ${CALL_TIMEOUT_MS}, setupSec ${SMALL.setupSec}] attempt 1: ${first.status}/${first.error?.kind ?? '-'} ` +
      `(${first.error?.code ?? ''}); setupMs ${secs(first.timings.setupMs)}, closeMs ${secs(first.timings.closeMs)}; active to result.json ${secs(attemptMs)}; ` +
      `held call given up after ${held?.abandonedAt === undefined ? 'never (still open)' : secs(held.abandonedAt - held.at)}`);
    expect(held).toBeDefined();
    expect.soft(attemptMs, 'job active to attempt-1/result.json (ms)').toBeLessThanOrEqual((SMALL.setupSec + SMALL.closeSec) * 1000 + SLACK_MS);
    expect.soft(first).toMatchObject({ status: 'error', reward: null, error: { kind: 'infra' } });
    if (first.timings.setupMs !== undefined) expect.soft(first.timings.setupMs).toBeLessThanOrEqual(SMALL.setupSec * 1000 + SLACK_MS);

    docker.releaseAll();
    await expectPassedInTheEnd(env, plan.batchId, 2);
  });

  it('the agent phase ends by its ceiling while the model never answers, and the episode is still graded', async () => {
    // A model endpoint that takes every request and never answers.
    const hung: { at: number; closedAt?: number }[] = [];
    const sockets = new Set<net.Socket>();
    const model = http.createServer((req) => {
      const call: { at: number; closedAt?: number } = { at: Date.now() };
      hung.push(call);
      req.resume();
      req.socket.on('close', () => (call.closedAt = Date.now()));
    });
    model.on('connection', (s: net.Socket) => {
      sockets.add(s);
      s.on('close', () => sockets.delete(s));
    });
    await new Promise<void>((resolve) => model.listen(0, '127.0.0.1', resolve));
    cleanups.push(async () => {
      const closed = new Promise<void>((resolve) => model.close(() => resolve()));
      for (const s of sockets) s.destroy();
      await closed;
    });
    const { port } = model.address() as net.AddressInfo;

    const reserves: Reserves = { setupSec: 5, verifySec: 5, closeSec: 5 };
    const deadlineSec = 25;
    const ceilingSec = deadlineSec - reserves.setupSec - reserves.verifySec - reserves.closeSec;
    const plan = await enqueueFile(env, await batch('agent-model', '{ kind: llm, maxTurns: 3 }', { deadlineSec, reserves, verifyTimeoutSec: 5 }));
    const episodeId = plan.jobs[0]!.episodeId;
    const active = await watchActive(env, episodeId);
    cleanups.push(() => active.stop());
    await start('agent-model-w', {
      model: { baseUrl: `http://127.0.0.1:${port}/v1`, apiKey: 'sk-test-hung', maxCalls: 10, maxTokens: 100_000, requestTimeoutMs: 120_000, upstreamRetries: 0 },
    });
    const activeAt = await active.at;

    const [result] = await waitForResults(env, plan.batchId, 1, 90_000);
    const { seenAt } = await waitForAttempt(env, episodeId, 1, 10_000);
    const firstCall = hung[0];
    console.info(`[agent, model never answers, requestTimeoutMs 120000, ceiling ${ceilingSec} s of deadline ${deadlineSec} s] result: ${result!.status}/${result!.error?.kind ?? '-'} ` +
      `(${result!.error?.code ?? ''}) reward ${String(result!.reward)}; agentMs ${secs(result!.timings.agentMs)}, totalMs ${secs(result!.timings.totalMs)}; ` +
      `model calls ${hung.length}; first call to result.json ${firstCall === undefined ? 'n/a' : secs(seenAt - firstCall.at)}; active to result.json ${secs(seenAt - activeAt)}`);
    expect(firstCall).toBeDefined();
    expect(result).toMatchObject({ status: 'timeout', reward: 0, attempts: 1 });
    expect(result!.timings.agentMs ?? Infinity).toBeLessThanOrEqual(ceilingSec * 1000 + SLACK_MS);
    // From outside: the agent asked the model after its set-up, and the whole episode kept its deadline.
    expect(seenAt - activeAt).toBeLessThanOrEqual(deadlineSec * 1000 + SLACK_MS);
    await waitFor('no sandbox of the batch', async () => (await fleetContainers('batch', plan.batchId)).length === 0, 60_000, 200);
  });

  it('verify with the end of the turn\'s exec hung ends within its reserve as an infra error, never a reward', async () => {
    const plan = await enqueueFile(env, await batch('verify-docker', COMMAND_AGENT, { deadlineSec: 60, reserves: SMALL, verifyTimeoutSec: 5 }));
    const episodeId = plan.jobs[0]!.episodeId;
    // The agent is a container's first exec; every exec after it (the end of the turn, which carries
    // the tests in, and its tries after a restart) is held.
    const execs = new Map<string, number>();
    docker.hold((method, p) => {
      const m = /^\/containers\/([0-9a-f]+)\/exec$/.exec(p.split('?')[0]!);
      if (method !== 'POST' || !m) return false;
      const n = (execs.get(m[1]!) ?? 0) + 1;
      execs.set(m[1]!, n);
      return n >= 2;
    });
    await start('verify-docker-w');

    const { result: first, seenAt } = await waitForAttempt(env, episodeId, 1, 90_000);
    const held = docker.held[0];
    const fromHeldMs = held === undefined ? undefined : seenAt - held.at;
    console.info(`[verify, the end of the turn's exec held, callTimeoutMs ${CALL_TIMEOUT_MS}, verifySec ${SMALL.verifySec}, closeSec ${SMALL.closeSec}] attempt 1: ${first.status}/${first.error?.kind ?? '-'} ` +
      `(${first.error?.code ?? ''}) reward ${String(first.reward)}; verifyMs ${secs(first.timings.verifyMs)}, closeMs ${secs(first.timings.closeMs)}; held exec to result.json ${secs(fromHeldMs)}; ` +
      `held call given up after ${held?.abandonedAt === undefined ? 'never (still open)' : secs(held.abandonedAt - held.at)}`);
    expect(held).toBeDefined();
    // From outside: verify was under way when the exec was held; it and the close end within their reserves.
    expect.soft(fromHeldMs, 'held exec to attempt-1/result.json (ms)').toBeLessThanOrEqual((SMALL.verifySec + SMALL.closeSec) * 1000 + SLACK_MS);
    expect.soft(first).toMatchObject({ status: 'error', reward: null, error: { kind: 'infra' } });
    if (first.timings.verifyMs !== undefined) expect.soft(first.timings.verifyMs).toBeLessThanOrEqual(SMALL.verifySec * 1000 + SLACK_MS);
    // Not graded: no result while the retry has not run.
    expect(await env.results.get(plan.batchId, episodeId)).toBeUndefined();

    docker.releaseAll();
    await expectPassedInTheEnd(env, plan.batchId, 2);
  });

  it('close with Redis paused and the workspace GET hung ends within its reserve; the result and the cleanup follow', async () => {
    // A file the sandbox user cannot read: the sweep cannot copy the workspace, so close asks the engine.
    const agent = '{ kind: command, command: "echo fixed > state.txt; echo x > locked.txt; chmod 000 locked.txt" }';
    const plan = await enqueueFile(env, await batch('close-stall', agent, { deadlineSec: 60, reserves: SMALL, verifyTimeoutSec: 5 }));
    const episodeId = plan.jobs[0]!.episodeId;
    const pauser = await redisPauser(env);
    cleanups.push(() => pauser.close());
    // Close then starts by taking the sandbox's workspace out: hold that, and pause Redis as it arrives.
    let paused: Promise<unknown> | undefined;
    docker.hold((method, p) => {
      const hold = method === 'GET' && /^\/containers\/[0-9a-f]+\/archive\?path=%2Fworkspace/.test(p);
      if (hold && paused === undefined) paused = pauser.pause(PAUSE_MS);
      return hold;
    });
    await start('close-stall-w');

    await waitFor('the close to ask for the workspace', async () => docker.held.length > 0, 60_000, 50);
    const held = docker.held[0]!;
    await paused;
    const { result: attempt, seenAt } = await waitForAttempt(env, episodeId, 1, 90_000);
    const fromHeldMs = seenAt - held.at;
    console.info(`[close, Redis paused ${PAUSE_MS / 1000} s and workspace GET held, closeSec ${SMALL.closeSec}] attempt 1: ${attempt.status}/${attempt.error?.kind ?? '-'} ` +
      `reward ${String(attempt.reward)}; closeMs ${secs(attempt.timings.closeMs)}; held GET to result.json ${secs(fromHeldMs)}; ` +
      `held call given up after ${held.abandonedAt === undefined ? 'never (still open)' : secs(held.abandonedAt - held.at)}`);
    expect.soft(fromHeldMs, 'held workspace GET to attempt-1/result.json (ms)').toBeLessThanOrEqual(SMALL.closeSec * 1000 + SLACK_MS);
    if (attempt.timings.closeMs !== undefined) expect.soft(attempt.timings.closeMs).toBeLessThanOrEqual(SMALL.closeSec * 1000 + SLACK_MS);

    // Once Redis answers and the engine is released, the episode has its one result, graded.
    docker.releaseAll();
    await expectPassedInTheEnd(env, plan.batchId, 1);
    // The evidence folder of the attempt exists even if the workspace could not be taken out.
    expect((await stat(path.join(env.dataDir, 'evidence', episodeId, 'attempt-1'))).isDirectory()).toBe(true);
  });
});
