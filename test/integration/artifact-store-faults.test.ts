// A worker on an S3 artifact store that is held (slow: no byte passes) or down (connections refused)
// for the whole run of a batch of llm episodes, which checkpoint every turn: every episode still gets
// its result, graded normally and within its deadline; checkpoint writes fail or wait, and never hold
// the agent. Evidence close could not publish stays in the outbox and the background publisher copies
// it once the store is back. And checkpoints: those offered while the store was down are lost, a later
// one is written once it is back, and the Redis pointer and latest() read it (newest wins later).
import { existsSync } from 'node:fs';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { CHECKPOINTS_QUEUE } from '../../queues/checkpoints/contract.ts';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import { S3Store } from '../../src/artifacts/s3-store.ts';
import { collectBytes } from '../../src/archive/tar-buffer.ts';
import { CheckpointSink } from '../../src/checkpoints/checkpoint-sink.ts';
import { ObjectCheckpointStore } from '../../src/checkpoints/object-checkpoint-store.ts';
import { startCheckpointWriter } from '../../src/worker/checkpoint-writer.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { checkpointLatestKey } from '../../src/redis/redis-keys.ts';
import { offerOf, sha256, streamOf, workspaceTar } from '../helpers/checkpoints.ts';
import { EXAMPLES, enqueueFile, silentLog, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { startS3Server, type S3TestServer } from '../helpers/s3-server.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

/** Reserves short enough that a phase held by the store would show, long enough for a loaded host. */
const RESERVES = { setupSec: 30, closeSec: 10 };

describe('artifact store down or slow', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let s3: S3TestServer;
  let checkpointsQueue: Queue;
  const closers: (() => Promise<unknown>)[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    s3 = await startS3Server();
    // A model that takes a moment per turn, as a real one does: the agent checkpoints after each.
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0, host: '127.0.0.1' }, delayMs: 200, log: silentLog });
    checkpointsQueue = new Queue(CHECKPOINTS_QUEUE, { connection: env.client, prefix: env.prefix });
  });
  const workerClosers: (() => Promise<unknown>)[] = [];
  afterEach(async () => {
    await s3?.resume().catch(() => undefined);
    for (const close of workerClosers.splice(0).reverse()) await close().catch(() => undefined);
  });
  afterAll(async () => {
    await s3?.resume().catch(() => undefined);
    for (const close of closers.reverse()) await close().catch(() => undefined);
    await checkpointsQueue?.close();
    await stub?.close();
    await s3?.stop();
    await env?.close();
  });

  const storeAt = (prefix: string) => {
    const store = S3Store.fromUrl(`s3://${s3.bucket}/${prefix}`, s3.env);
    closers.push(async () => store.destroy());
    return store;
  };

  async function s3Worker(id: string, storePrefix: string, concurrency: number): Promise<WorkerHandle> {
    const worker = await startEnvWorker(env, id, {
      concurrency,
      outputCapBytes: 256 * 1024,
      drainTimeoutMs: 5_000,
      model: { baseUrl: stub.baseUrl!, maxCalls: 20, maxTokens: 200_000, requestTimeoutMs: 30_000, upstreamRetries: 2 },
      artifacts: storeAt(storePrefix),
      // The background publisher tries the outbox every second here (30 s in production).
      outboxIntervalMs: 1_000,
    });
    // Stopped when its test ends: workers of one data folder share its outbox, and one still running
    // with another test's store would publish that test's evidence to the wrong place.
    workerClosers.push(() => worker.close());
    return worker;
  }

  async function llmBatch(tasks: string[]) {
    const file = await writeBatch(
      `tasks: ${JSON.stringify(tasks.map((t) => path.join(EXAMPLES, 'tasks', t)))}\nagent: { kind: llm, maxTurns: 10 }\ndefaults: { reserves: ${JSON.stringify(RESERVES)} }\n`,
      {},
    );
    const t0 = Date.now();
    const plan = await enqueueFile(env, file);
    return { plan, t0 };
  }

  /** Graded as with a healthy store, one attempt, within its deadline, the agent never held. */
  function expectGradedOnTime(results: EpisodeResult[], deadlineSec: Map<string, number>) {
    for (const r of results) {
      const label = `${r.episodeId} (${r.taskId}): ${JSON.stringify(r.error)} ${JSON.stringify(r.timings)}`;
      const expected = r.taskId === 'reverse-lines' ? ['failed', 0] : ['passed', 1];
      expect([r.status, r.reward], label).toEqual(expected);
      expect(r.attempts, label).toBe(1);
      expect(r.agent?.timedOut, label).toBe(false);
      const deadlineMs = deadlineSec.get(r.episodeId)! * 1000;
      const t = r.timings;
      expect(t.totalMs, label).toBeLessThanOrEqual(deadlineMs);
      expect(Date.parse(r.endedAt) - Date.parse(r.startedAt), label).toBeLessThanOrEqual(deadlineMs);
      expect(t.setupMs, label).toBeLessThanOrEqual(RESERVES.setupSec * 1000);
      // Close waits for the store no longer than its reserve.
      expect(t.closeMs, label).toBeLessThanOrEqual(RESERVES.closeSec * 1000 + 1_000);
      // The agent ran at the model's pace: well inside its ceiling (a few turns of 200 ms each).
      expect(t.agentMs, label).toBeLessThan(30_000);
    }
    // No turn was asked of the model twice (no attempt repeated).
    const ids = new Set(results.map((r) => r.episodeId));
    expect(stub.calls().filter((c) => ids.has(c.episodeId)).every((c) => c.count === 1)).toBe(true);
  }

  /** Checkpoint jobs of these episodes that were written to the store. */
  async function writtenCheckpoints(episodeIds: Set<string>) {
    const completed = await checkpointsQueue.getCompleted(0, -1);
    return completed.filter((j) => episodeIds.has((j.data as { episodeId: string }).episodeId) && (j.returnvalue as { outcome?: string } | undefined)?.outcome === 'written');
  }

  /** Files of an attempt's evidence folder, as the publisher copies them (dot files left out). */
  async function localEvidence(episodeId: string): Promise<string[]> {
    const root = path.join(env.dataDir, 'evidence', episodeId, 'attempt-1');
    const entries = await readdir(root, { recursive: true, withFileTypes: true });
    return entries
      .filter((e) => e.isFile() && !e.name.startsWith('.'))
      .map((e) => path.relative(env.dataDir, path.join(e.parentPath, e.name)).split(path.sep).join('/'))
      .filter((rel) => !rel.split('/').some((seg) => seg.startsWith('.')))
      .sort();
  }

  const markerOf = (episodeId: string) => path.join(env.dataDir, 'outbox', `evidence__${episodeId}__attempt-1`);

  it('a held store: every llm episode gets its graded result within its deadline; checkpoints wait, the agent does not; evidence follows once it is back', async () => {
    const storePrefix = 'held';
    const tasks = ['fix-greeting', 'js-median', 'reverse-lines', 'set-port', 'sum-column'];
    s3.pause();
    await s3Worker('held-w', storePrefix, tasks.length);
    const { plan, t0 } = await llmBatch(tasks);
    const deadlines = new Map(plan.jobs.map((j) => [j.episodeId, j.task.deadlineSec] as const));
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, Math.max(...deadlines.values()) * 1000 + 30_000);
    const wallMs = Date.now() - t0;
    console.log('held store:', JSON.stringify({ wallMs, timings: results.map((r) => ({ task: r.taskId, status: r.status, ...r.timings })) }));
    expectGradedOnTime(results, deadlines);
    // All ran at once: the whole batch took no longer than one deadline.
    expect(wallMs).toBeLessThanOrEqual(Math.max(...deadlines.values()) * 1000);
    const ids = new Set(plan.jobs.map((j) => j.episodeId));
    // Checkpoints were offered (the model was asked several turns) but none reached the held store.
    expect(stub.calls().filter((c) => ids.has(c.episodeId)).length).toBeGreaterThanOrEqual(2 * tasks.length);
    expect(await writtenCheckpoints(ids)).toHaveLength(0);
    // Evidence close could not publish waits in the outbox.
    for (const id of ids) expect(existsSync(markerOf(id)), id).toBe(true);

    await s3.resume();
    const store = storeAt(storePrefix);
    for (const id of ids) {
      const local = await localEvidence(id);
      await waitFor(`evidence of ${id} published from the outbox`, async () => !existsSync(markerOf(id)), 90_000, 200);
      const inStore = (await store.list(`evidence/${id}/`, { signal: AbortSignal.timeout(10_000) })).map((o) => o.key);
      expect(inStore.length, id).toBeGreaterThan(0);
      expect(inStore, id).toEqual(expect.arrayContaining(local.filter((f) => !f.endsWith('/result.json'))));
    }
    // Once the episodes have their results, no checkpoint of theirs stays in the store.
    await waitFor('no checkpoint objects left', async () => (await store.list('checkpoints/', { signal: AbortSignal.timeout(10_000) })).length === 0, 60_000, 500);
    await waitForNoContainers(plan.batchId);
  }, 300_000);

  it('a store that is down: results on time, evidence in the outbox, copied by the background publisher once the store is back', async () => {
    const storePrefix = 'down';
    const tasks = ['fix-greeting', 'set-port', 'sum-column'];
    await s3.down();
    await s3Worker('down-w', storePrefix, tasks.length);
    const { plan, t0 } = await llmBatch(tasks);
    const deadlines = new Map(plan.jobs.map((j) => [j.episodeId, j.task.deadlineSec] as const));
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, Math.max(...deadlines.values()) * 1000 + 30_000);
    const wallMs = Date.now() - t0;
    console.log('down store:', JSON.stringify({ wallMs, timings: results.map((r) => ({ task: r.taskId, status: r.status, ...r.timings })) }));
    expectGradedOnTime(results, deadlines);
    expect(wallMs).toBeLessThanOrEqual(Math.max(...deadlines.values()) * 1000);
    const ids = new Set(plan.jobs.map((j) => j.episodeId));
    expect(await writtenCheckpoints(ids)).toHaveLength(0);
    // The writer tried and failed, retried with backoff; each job ends failed (given up) or fenced (a
    // retry after the result). None is left waiting on the store.
    await waitFor('checkpoint jobs settled', async () => {
      const jobs = (await checkpointsQueue.getJobs(['waiting', 'active', 'delayed', 'completed', 'failed'], 0, -1))
        .filter((j) => ids.has((j.data as { episodeId: string }).episodeId));
      const states = await Promise.all(jobs.map((j) => j.getState()));
      return jobs.length > 0 && states.every((st) => st === 'failed' || st === 'completed') ? jobs : undefined;
    }, 30_000, 200).then((jobs) => {
      expect(jobs.some((j) => j.attemptsMade >= 1 && (j.stacktrace?.length ?? 0) > 0)).toBe(true);
      for (const j of jobs) if (j.finishedOn && j.returnvalue) expect((j.returnvalue as { outcome: string }).outcome).toBe('fenced');
    });

    // The outbox keeps every attempt's folder while the store is down (the drain runs every second meanwhile).
    for (const id of ids) expect(existsSync(markerOf(id)), id).toBe(true);
    await s3.resume();
    const store = storeAt(storePrefix);
    for (const id of ids) {
      await waitFor(`evidence of ${id} published from the outbox`, async () => !existsSync(markerOf(id)), 60_000, 200);
      const local = await localEvidence(id);
      const inStore = await waitFor(`evidence of ${id} listed in the store`, async () => {
        const keys = (await store.list(`evidence/${id}/`, { signal: AbortSignal.timeout(10_000) })).map((o) => o.key);
        return keys.length > 0 ? keys : undefined;
      }, 10_000, 200);
      // Everything close wrote before publishing; result.json is written after (see the report).
      expect(inStore, id).toEqual(expect.arrayContaining(local.filter((f) => !f.endsWith('/result.json'))));
    }
    await waitForNoContainers(plan.batchId);
  }, 300_000);

  it('checkpoints offered while the store is down are lost; a later one is written once it is back, and the pointer and latest() name it', async () => {
    const storePrefix = 'newest';
    const prefix = `${env.prefix}nw`;
    const queue = new Queue(CHECKPOINTS_QUEUE, { connection: env.client, prefix });
    const sink = new CheckpointSink({ connection: env.client, queue, prefix, log: silentLog });
    const writer = startCheckpointWriter({ connection: env.client, prefix, dataDir: env.dataDir, log: silentLog, name: 'nw-writer', lockDurationMs: 5_000, artifacts: storeAt(storePrefix) });
    closers.push(async () => {
      await sink.close();
      await writer.close();
      await queue.close();
    });
    const store = new ObjectCheckpointStore(storeAt(storePrefix), env.client, prefix);
    const episodeId = 'ep-newest';

    await s3.down();
    for (let seq = 0; seq < 3; seq++) {
      const tar = await workspaceTar(64 * 1024, seq);
      // The offer returns at once, store or no store.
      const t = performance.now();
      sink.offer(offerOf(episodeId, seq, 5_000), streamOf(tar));
      expect(performance.now() - t).toBeLessThan(50);
      await sink.flush(episodeId);
    }
    // Every attempt of the newest job fails while the store is down.
    await waitFor('the checkpoint job given up', async () => (await queue.getFailed(0, -1)).some((j) => j.id === `${episodeId}.cp2`), 30_000, 200);
    expect(await env.client.get(checkpointLatestKey(prefix, episodeId))).toBeNull();

    await s3.resume();
    const tar = await workspaceTar(64 * 1024, 7);
    sink.offer(offerOf(episodeId, 3, 5_000), streamOf(tar));
    await sink.flush(episodeId);
    await waitFor('seq 3 durable', async () => (await env.client.get(checkpointLatestKey(prefix, episodeId))) === '3', 30_000, 100);
    const latest = await store.latest(episodeId);
    expect(latest?.seq).toBe(3);
    expect(latest?.checkpoint.turn).toBe(3);
    expect(sha256(await collectBytes(latest!.workspaceTar!.open()))).toBe(sha256(tar));
    // Older jobs still in their retries when the store came back may be written too (they are kept,
    // up to `keep`); the pointer never moves back, so the newest is what a resume reads.
    const seqs = await store.seqs(episodeId);
    expect(Math.max(...seqs)).toBe(3);
    expect((await store.latest(episodeId))?.seq).toBe(3);
  }, 120_000);
});
