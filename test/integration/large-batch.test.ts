// Batches of many episodes (bench/scale.ts measures 100,000): a batch larger than one flow goes in
// chunks behind a gate, and an interrupted one is completed by enqueueing it again; planned jobs are
// the ones a parse per episode made; the summary and the batch page read the results' outlines, which
// give the numbers the whole results give; `results` prints every line into a slow pipe. Real Redis;
// BullMQ workers with a stub processor stand for the fleet's (no Docker).
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Queue, Worker } from 'bullmq';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { BATCH_GATES_QUEUE, BATCHES_QUEUE } from '../../queues/batches/contract.ts';
import { EPISODES_QUEUE, EpisodeJob, type EpisodeResult } from '../../queues/episodes/contract.ts';
import { enqueueBatch, planBatch } from '../../src/producer/enqueue-batch.ts';
import { batchOutlinesKey, batchResultsKey, batchSummaryCacheKey } from '../../src/redis/redis-keys.ts';
import { summarize } from '../../src/results/batch-summary.ts';
import { loadBatch } from '../../src/tasks/load-task.ts';
import { BIN, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';

/** A batch file of one small task and `samples` episodes, named `name` (each name its own batch id). */
async function batchFile(dir: string, name: string, samples: number): Promise<string> {
  const task = path.join(dir, 'tasks', 'fix');
  await mkdir(path.join(task, 'workspace'), { recursive: true });
  await mkdir(path.join(task, 'tests'), { recursive: true });
  await writeFile(path.join(task, 'workspace', 'state.txt'), 'broken\n');
  await writeFile(path.join(task, 'tests', 'test.sh'), 'grep -qx fixed state.txt\n');
  await writeFile(path.join(task, 'task.yaml'), 'id: fix\ninstruction: write fixed into state.txt\nverify:\n  command: sh /tests/test.sh\n');
  const file = path.join(dir, `${name}.yaml`);
  await writeFile(file, `name: ${name}\ntasks: [tasks/fix]\nsamples: ${samples}\nagent: { kind: command, command: "true" }\n`);
  return file;
}

describe('large batches', () => {
  let env: FleetEnv;
  let dir: string;
  let batches: Queue;
  let gates: Queue;
  const workers: Worker[] = [];
  const deps = () => ({ flows: env.flows, redis: env.client, prefix: env.prefix, results: env.results });
  /** Small sizes, so a batch of 25 takes the chunked path in chunks of 7. */
  const small = { oneFlowMax: 10, chunk: 7 };

  beforeAll(async () => {
    env = await startFleetEnv();
    dir = await mkdtemp(path.join(os.tmpdir(), 'rf-large-batch-'));
    batches = new Queue(BATCHES_QUEUE, { connection: env.client, prefix: env.prefix });
    gates = new Queue(BATCH_GATES_QUEUE, { connection: env.client, prefix: env.prefix });
  });
  afterEach(async () => {
    vi.restoreAllMocks();
    await Promise.all(workers.splice(0).map((w) => w.close()));
  });
  afterAll(async () => {
    await batches?.close();
    await gates?.close();
    await env?.close();
  });

  /** Complete every waiting episode (a stub worker), and wait until `completed` of the batch's are done. */
  async function completeWaiting(batchId: string, completed: number): Promise<void> {
    const worker = new Worker(EPISODES_QUEUE, async () => 'done', { connection: env.client, prefix: env.prefix, concurrency: 10 });
    workers.push(worker);
    await waitFor(`${completed} completed episodes`, async () => (await env.episodes.getJobs(['completed'])).filter((j) => j.id?.startsWith(`${batchId}.`)).length >= completed, 30_000, 50);
    await worker.close();
  }

  const parentState = async (batchId: string) => (await batches.getJob(batchId))?.getState();

  it('adds a batch larger than one flow in chunks, every episode a child of the parent, which runs once all have ended', async () => {
    const file = await batchFile(dir, 'chunked', 25);
    const plan = await enqueueBatch(await loadBatch(file), deps(), small);
    expect(plan.added).toBe(true);
    const jobs = (await env.episodes.getJobs(['waiting'])).filter((j) => j.id?.startsWith(`${plan.batchId}.`));
    expect(jobs.map((j) => j.id).sort()).toEqual(plan.jobs.map((j) => j.episodeId).sort());
    for (const job of jobs) {
      expect(job.parent?.id).toBe(plan.batchId);
      expect(job.data).toEqual(plan.jobs.find((j) => j.episodeId === job.id));
      expect(job.opts.ignoreDependencyOnFailure).toBe(true);
    }
    expect(await parentState(plan.batchId)).toBe('waiting-children');
    expect((await (await batches.getJob(plan.batchId))!.getDependenciesCount()).unprocessed).toBe(25);
    expect(await gates.getJob(plan.batchId)).toBeUndefined();

    // The same batch again adds nothing.
    expect((await enqueueBatch(await loadBatch(file), deps(), small)).added).toBe(false);
    expect((await env.episodes.getJobs(['waiting'])).filter((j) => j.id?.startsWith(`${plan.batchId}.`))).toHaveLength(25);

    await completeWaiting(plan.batchId, 25);
    await waitFor('the parent to be released', async () => (await parentState(plan.batchId)) === 'waiting', 10_000, 50);
  });

  it('keeps an interrupted batch behind its gate, even when every episode added so far has ended; enqueueing it again completes it', async () => {
    const file = await batchFile(dir, 'interrupted', 25);
    const addBulk = Queue.prototype.addBulk;
    let calls = 0;
    vi.spyOn(Queue.prototype, 'addBulk').mockImplementation(async function (this: Queue, jobs) {
      calls += 1;
      if (calls === 2) throw new Error('producer lost half-way');
      return addBulk.call(this, jobs);
    });
    await expect(enqueueBatch(await loadBatch(file), deps(), small)).rejects.toThrow('producer lost half-way');
    vi.restoreAllMocks();
    const plan = await planBatch(await loadBatch(file));
    const added = () => env.episodes.getJobs(['waiting', 'completed']).then((js) => js.filter((j) => j.id?.startsWith(`${plan.batchId}.`)));
    expect(await added()).toHaveLength(7);
    expect(await gates.getJob(plan.batchId)).toBeDefined();

    // The 7 end; the gate holds the parent back.
    await completeWaiting(plan.batchId, 7);
    expect(await parentState(plan.batchId)).toBe('waiting-children');

    // Completed even by a producer that would add a batch of this size as one flow: the gate decides.
    const again = await enqueueBatch(await loadBatch(file), deps(), { ...small, oneFlowMax: 100 });
    expect(again).toMatchObject({ batchId: plan.batchId, added: true });
    expect((await added()).map((j) => j.id).sort()).toEqual(plan.jobs.map((j) => j.episodeId).sort());
    expect(await gates.getJob(plan.batchId)).toBeUndefined();
    expect(await parentState(plan.batchId)).toBe('waiting-children');
    expect((await (await batches.getJob(plan.batchId))!.getDependenciesCount()).unprocessed).toBe(18);

    await completeWaiting(plan.batchId, 25);
    await waitFor('the parent to be released', async () => (await parentState(plan.batchId)) === 'waiting', 10_000, 50);
    // Complete now: a third enqueue adds nothing.
    expect((await enqueueBatch(await loadBatch(file), deps(), small)).added).toBe(false);
  });

  it('plans the jobs a parse per episode made, byte for byte', async () => {
    const loaded = await loadBatch(await batchFile(dir, 'planned', 12));
    const now = new Date('2026-01-02T03:04:05.678Z');
    const plan = await planBatch(loaded, now);
    const spec = loaded.tasks[0]!.spec;
    const one = (sample: number) => EpisodeJob.parse({
      episodeId: `${plan.batchId}.${spec.id}.${sample}`, batchId: plan.batchId, sample, task: spec, taskDigest: plan.tasks[0]!.digest,
      agent: loaded.batch.agent, enqueuedAt: now.toISOString(),
    });
    expect(plan.jobs.map((j) => JSON.stringify(j))).toEqual(Array.from({ length: 12 }, (_, s) => JSON.stringify(one(s))));
  });

  describe('outlines', () => {
    const batchId = 'outlined-000000000000';
    // Recorded in another order than the manifest's, with every field the summary and page read.
    const ids = ['t-b', 't-a', 't-c'].flatMap((t) => [0, 1, 2, 3].map((s) => `${batchId}.${t}.${s}`));
    const result = (episodeId: string, i: number): EpisodeResult => {
      const [, taskId, sample] = episodeId.split('.') as [string, string, string];
      const status = (['passed', 'failed', 'error', 'timeout', 'passed', 'cancelled'] as const)[i % 6]!;
      return {
        episodeId, batchId, taskId, sample: Number(sample), status,
        ...(status === 'error' && { error: { kind: i % 4 === 0 ? 'infra' : 'agent', code: `code_${i}`, message: 'm' } }),
        reward: status === 'passed' ? 1 : status === 'failed' ? (i % 3) / 10 : null,
        attempts: 1 + (i % 3), workerId: `w-${i % 2}`,
        timings: { totalMs: 1000 + i * 7, ...(i % 2 === 0 && { setupMs: 100 + i }), ...(i % 3 !== 0 && { agentMs: 500 + i, verifyMs: 50 + i }), ...(i % 5 === 0 && { closeMs: 10 }) },
        provenance: { taskDigest: '0'.repeat(64), image: 'busybox:1.36', agent: { kind: 'command', command: 'true' } },
        ...(i % 2 === 1 && { usage: { promptTokens: 100 * i, completionTokens: 10 * i, totalTokens: 110 * i } }),
        startedAt: '2026-01-01T00:00:00.000Z', endedAt: '2026-01-01T00:00:01.000Z',
      };
    };
    const expected = async () => summarize(batchId, ids.length, await env.results.results(batchId));

    beforeAll(async () => {
      await env.results.putManifest({ batchId, name: 'outlined', createdAt: new Date().toISOString(), episodeIds: ids });
      for (const [i, id] of [...ids].reverse().entries()) if (i !== 5) await env.results.record(result(id, i));
    });

    it('give the summary (key order included) and the page fields the whole results give', async () => {
      const summary = await env.results.summary(batchId);
      expect(JSON.stringify(summary)).toBe(JSON.stringify(await expected()));
      expect(summary).toMatchObject({ done: 11, finished: false });
      const outlines = await env.results.outlines(batchId);
      const full = await env.results.results(batchId);
      expect(outlines.map((o) => o.episodeId)).toEqual(full.map((r) => r.episodeId));
      expect(outlines).toEqual(full.map((r) => ({
        episodeId: r.episodeId, taskId: r.taskId, status: r.status, reward: r.reward, attempts: r.attempts, workerId: r.workerId,
        ...(r.error && { error: { kind: r.error.kind, code: r.error.code } }), timings: r.timings, ...(r.usage && { usage: r.usage }), endedAt: r.endedAt,
      })));
    });

    it('fall back to the results when they do not cover every result (recorded before outlines were kept)', async () => {
      const key = batchOutlinesKey(env.prefix, batchId);
      const saved = await env.client.hgetall(key);
      await env.client.hdel(key, ids[0]!);
      expect(JSON.stringify(await env.results.summary(batchId))).toBe(JSON.stringify(await expected()));
      await env.client.del(key);
      expect(JSON.stringify(await env.results.summary(batchId))).toBe(JSON.stringify(await expected()));
      await env.client.hset(key, saved);
    });

    it('are forgotten with their result by a retry by kind', async () => {
      const id = ids.find((x) => x.endsWith('.t-a.1'))!;
      expect(await env.results.has(batchId, id)).toBe(true);
      await env.results.markForRetry(id);
      expect(await env.results.resultUnlessRetried(batchId, id)).toBeUndefined();
      expect(await env.client.hexists(batchOutlinesKey(env.prefix, batchId), id)).toBe(0);
      expect((await env.results.outlines(batchId)).map((o) => o.episodeId)).not.toContain(id);
      expect(JSON.stringify(await env.results.summary(batchId))).toBe(JSON.stringify(await expected()));
    });

    it('keep the summary computed for the next reader while the results are the same, and not after', async () => {
      const cacheKey = batchSummaryCacheKey(env.prefix, batchId);
      await env.client.del(cacheKey);
      const computed = await env.results.summary(batchId);
      const cached = JSON.parse((await env.client.get(cacheKey))!) as { summary: unknown };
      expect(cached.summary).toEqual(computed);
      // A summary planted in the cache is what a reader gets while nothing changed...
      const plant = async () => env.client.set(cacheKey, JSON.stringify({ ...cached, summary: { ...computed, batchId: 'from-the-cache' } }));
      await plant();
      expect((await env.results.summary(batchId))?.batchId).toBe('from-the-cache');
      // ...not once a result is recorded,
      await env.results.record(result(ids.find((x) => x.endsWith('.t-a.2'))!, 5));
      expect(JSON.stringify(await env.results.summary(batchId))).toBe(JSON.stringify(await expected()));
      // nor forgotten,
      await plant();
      const retried = ids.find((x) => x.endsWith('.t-c.0'))!;
      await env.results.markForRetry(retried);
      await env.results.resultUnlessRetried(batchId, retried);
      expect(JSON.stringify(await env.results.summary(batchId))).toBe(JSON.stringify(await expected()));
      // nor taken away by a worker of an earlier version (which bumps no version: the count changes).
      await plant();
      await env.client.hdel(batchResultsKey(env.prefix, batchId), ids[0]!);
      expect(JSON.stringify(await env.results.summary(batchId))).toBe(JSON.stringify(await expected()));
    });
  });

  it('`results` prints every line into a pipe whose reader is behind (it used to exit with the output half-written), and ends quietly when the reader goes', async () => {
    const batchId = 'piped-000000000000';
    const ids = Array.from({ length: 2_000 }, (_, i) => `${batchId}.t.${i}`);
    await env.results.putManifest({ batchId, name: 'piped', createdAt: new Date().toISOString(), episodeIds: ids });
    await Promise.all(ids.map((episodeId, i) => env.results.record({
      episodeId, batchId, taskId: 't', sample: i, status: 'passed', reward: 1, attempts: 1, workerId: 'w'.repeat(200), timings: { totalMs: 1 },
      provenance: { taskDigest: '0'.repeat(64), image: 'busybox:1.36', agent: { kind: 'command', command: 'true' } }, startedAt: '', endedAt: '',
    })));
    const child = spawn(process.execPath, [BIN, 'results', batchId], { env: env.env, stdio: ['ignore', 'pipe', 'inherit'] });
    const closed = once(child, 'close') as Promise<[number | null]>;
    child.stdout.pause();
    // Read nothing until the command has exited or is held by the full pipe (its connection idle).
    await waitFor('the command to exit or wait on the pipe', async () => child.exitCode !== null
      || String(await env.client.client('LIST')).split('\n').some((c) => c.includes('name=rf-cli') && Number(/ idle=(\d+)/.exec(c)?.[1]) >= 1), 30_000, 50);
    let lines = 0;
    child.stdout.on('data', (c: Buffer) => {
      for (let i = c.indexOf(10); i !== -1; i = c.indexOf(10, i + 1)) lines += 1;
    });
    child.stdout.resume();
    const [code] = await closed;
    expect(code).toBe(0);
    expect(lines).toBe(2_000);

    // A reader that stops after the first line (`| head -1`): a quiet exit 0, no EPIPE stack trace.
    const early = spawn(process.execPath, [BIN, 'results', batchId], { env: env.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    early.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const earlyClosed = once(early, 'close') as Promise<[number | null]>;
    early.stdout.once('data', () => early.stdout.destroy());
    expect((await earlyClosed)[0]).toBe(0);
    expect(stderr).toBe('');
  });
});
