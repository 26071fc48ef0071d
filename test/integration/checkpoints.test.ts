// The checkpoint pipeline on a real Redis and a real disk: the sink keeps Redis bounded however far the
// writer falls behind and the newest checkpoint is still written; writes are idempotent, latest.json
// only moves forward (even with two writers racing), the last N are kept; an oversized workspace is
// recorded as not captured, with the reason; abandoned temp folders are ignored and cleaned up.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, readFile, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { Queue, type Worker } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHECKPOINTS_QUEUE, checkpointJobId } from '../../queues/checkpoints/contract.ts';
import { collectBytes } from '../../src/archive/tar-buffer.ts';
import type { Checkpoint } from '../../src/checkpoints/checkpoint.ts';
import { CheckpointSink } from '../../src/checkpoints/checkpoint-sink.ts';
import { FolderStore } from '../../src/artifacts/folder-store.ts';
import { FolderCheckpointStore } from '../../src/checkpoints/folder-checkpoint-store.ts';
import { redisEpisodeLock } from '../../src/checkpoints/episode-lock.ts';
import { startCheckpointWriter } from '../../src/worker/checkpoint-writer.ts';
import { silentLog, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';
import { allStaged, offerOf, redisHoldings, sha256, streamOf, workspaceTar } from '../helpers/checkpoints.ts';

describe('checkpoint pipeline', () => {
  let env: FleetEnv;
  const closers: (() => Promise<unknown>)[] = [];

  /** A fresh key prefix and data folder on the shared private Redis. */
  async function scope() {
    const prefix = `${env.prefix}${randomBytes(3).toString('hex')}`;
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-cp-'));
    closers.unshift(() => rm(dataDir, { recursive: true, force: true }));
    const queue = new Queue(CHECKPOINTS_QUEUE, { connection: env.client, prefix });
    closers.push(() => queue.close());
    return { prefix, dataDir, queue };
  }
  function sink(prefix: string, workspaceCapBytes?: number): CheckpointSink {
    const queue = new Queue(CHECKPOINTS_QUEUE, { connection: env.client, prefix });
    const s = new CheckpointSink({ connection: env.client, queue, prefix, log: silentLog, ...(workspaceCapBytes && { workspaceCapBytes }) });
    closers.push(async () => {
      await s.close();
      await queue.close();
    });
    return s;
  }
  function writer(prefix: string, dataDir: string, keep = 5, concurrency = 4): Worker {
    const w = startCheckpointWriter({ connection: env.client, prefix, dataDir, log: silentLog, name: 'test-writer', keep, concurrency, lockDurationMs: 5_000 });
    closers.push(() => w.close());
    return w;
  }

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    for (const close of closers.reverse()) await close();
    await env?.close();
  });

  it('holds at most two checkpoints per episode in Redis while no writer runs, and the newest is written once one does', async () => {
    const { prefix, dataDir, queue } = await scope();
    const s = sink(prefix);
    const episodes = ['bound-a', 'bound-b', 'bound-c'];
    const tar = await workspaceTar(256 * 1024);
    let maxJobs = 0;
    let maxStaged = 0;
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        for (const e of episodes) {
          const held = await redisHoldings(env.client, prefix, e);
          maxJobs = Math.max(maxJobs, held.jobs);
          maxStaged = Math.max(maxStaged, held.staged);
        }
      }
    })();

    const N = 30;
    for (let seq = 0; seq < N; seq++) {
      // Half the offers come in bursts (the newest replaces the one waiting in memory), half one by one
      // (each handed over to Redis, superseding the job before it there).
      for (const e of episodes) s.offer(offerOf(e, seq, 50_000), streamOf(tar));
      if (seq % 2 === 1) {
        const handed = s.stats.handedOver;
        await waitFor('a hand-off', async () => s.stats.handedOver > handed, 10_000, 5);
      }
    }
    for (const e of episodes) expect(await s.flush(e)).toBe(N - 1);
    sampling = false;
    await sampler;

    expect(s.stats.failed).toBe(0);
    expect(s.stats.offered).toBe(N * episodes.length);
    expect(s.stats.replaced).toBeGreaterThan(0);
    expect(s.stats.superseded).toBeGreaterThan(0);
    expect(maxJobs).toBeLessThanOrEqual(2);
    expect(maxStaged).toBeLessThanOrEqual(2);
    for (const e of episodes) expect(await redisHoldings(env.client, prefix, e)).toEqual({ jobs: 1, staged: 1 });
    expect(await queue.getWaitingCount()).toBe(episodes.length);

    writer(prefix, dataDir);
    const store = new FolderCheckpointStore(new FolderStore(dataDir));
    for (const e of episodes) {
      const latest = await waitFor(`the newest checkpoint of ${e} on disk`, async () => store.latest(e), 30_000, 20);
      expect(latest.seq).toBe(N - 1);
      expect(latest.checkpoint.messages.length).toBeGreaterThan(40);
      expect(latest.workspaceTar?.bytes).toBe(tar.length);
      expect(await store.seqs(e)).toEqual([N - 1]);
    }
    await waitFor('the writer to delete every stage', async () => (await allStaged(env.client, prefix)).length === 0, 10_000, 20);
  });

  it('writes the same checkpoint twice as one, moves latest.json only forward even with two writers racing, keeps the last N', async () => {
    const { prefix, dataDir, queue } = await scope();
    const checkpoint = (seq: number, note = ''): Checkpoint => ({
      ...offerOf('same', seq, 2_000, note),
      createdAt: new Date().toISOString(),
      workspace: { captured: false, reason: 'no snapshot offered' },
    });
    // Two stores = two writers sharing the folder, coordinated by the Redis lock.
    const one = new FolderCheckpointStore(new FolderStore(dataDir), { keep: 3, lock: redisEpisodeLock(env.client, prefix) });
    const two = new FolderCheckpointStore(new FolderStore(dataDir), { keep: 3, lock: redisEpisodeLock(env.client, prefix) });

    expect((await one.write(checkpoint(4))).outcome).toBe('written');
    const first = await readFile(path.join(one.folder('same'), '00000004', 'checkpoint.json'), 'utf8');
    expect((await two.write(checkpoint(4, ' again'))).outcome).toBe('already-written');
    expect(await readFile(path.join(one.folder('same'), '00000004', 'checkpoint.json'), 'utf8')).toBe(first);
    expect(await one.seqs('same')).toEqual([4]);

    // Watch latest.json while both write out of order and concurrently.
    const seen: number[] = [];
    let watching = true;
    const watcher = (async () => {
      while (watching) {
        const text = await readFile(path.join(one.folder('same'), 'latest.json'), 'utf8').catch(() => undefined);
        if (text !== undefined) seen.push((JSON.parse(text) as { seq: number }).seq);
        await new Promise((r) => setImmediate(r));
      }
    })();
    const order = [9, 2, 5, 8, 1, 7, 3, 6, 0, 11, 10];
    await Promise.all(order.map((seq, i) => (i % 2 === 0 ? one : two).write(checkpoint(seq))));
    expect((await two.write(checkpoint(8))).latest).toBe(11);
    watching = false;
    await watcher;
    expect(seen.length).toBeGreaterThan(0);
    expect(seen).toEqual([...seen].sort((a, b) => a - b));
    expect(JSON.parse(await readFile(path.join(one.folder('same'), 'latest.json'), 'utf8'))).toMatchObject({ seq: 11 });
    expect(await one.seqs('same')).toEqual([9, 10, 11]);
    expect((await one.latest('same'))?.seq).toBe(11);
    expect((await one.write(checkpoint(2))).outcome).toBe('superseded');
    expect(await one.seqs('same')).toEqual([9, 10, 11]);
    // Nothing but the kept folders and the pointer is left (pruned folders are renamed away, then deleted).
    expect((await readdir(one.folder('same'))).sort()).toEqual(['00000009', '00000010', '00000011', 'latest.json']);

    // Through the queue: the same seq handed over again is written once.
    const w = writer(prefix, dataDir, 3);
    const s = sink(prefix);
    s.offer(offerOf('same', 12, 2_000, ' first'), undefined);
    await s.flush('same');
    const jobId = checkpointJobId('same', 12);
    await waitFor('seq 12 written', async () => (await queue.getJobState(jobId)) === 'completed', 20_000, 20);
    expect((await queue.getJob(jobId))?.returnvalue).toMatchObject({ outcome: 'written', latest: 12 });
    const written = await readFile(path.join(one.folder('same'), '00000012', 'checkpoint.json'), 'utf8');
    await queue.remove(jobId);
    s.offer(offerOf('same', 12, 2_000, ' second'), undefined);
    await s.flush('same');
    await waitFor('seq 12 handled again', async () => (await queue.getJobState(jobId)) === 'completed', 20_000, 20);
    expect((await queue.getJob(jobId))?.returnvalue).toMatchObject({ outcome: 'already-written', latest: 12 });
    expect(await readFile(path.join(one.folder('same'), '00000012', 'checkpoint.json'), 'utf8')).toBe(written);
    expect(await one.seqs('same')).toEqual([10, 11, 12]);
    await w.close();
  });

  it('records a workspace over the cap as not captured, with the reason, and keeps one under it byte for byte', async () => {
    const { prefix, dataDir } = await scope();
    const cap = 64 * 1024;
    const s = sink(prefix, cap);
    writer(prefix, dataDir);
    const small = await workspaceTar(40 * 1024, 1);
    const big = await workspaceTar(200 * 1024, 2);
    s.offer(offerOf('capped', 0), streamOf(small));
    await s.flush('capped');
    s.offer(offerOf('capped', 1), streamOf(big));
    await s.flush('capped');
    const store = new FolderCheckpointStore(new FolderStore(dataDir));

    const stored0 = await waitFor('seq 0', async () => store.read('capped', 0), 20_000, 20);
    expect(stored0.checkpoint.workspace).toEqual({ captured: true, file: 'workspace.tar', bytes: small.length, sha256: sha256(small) });
    expect((await collectBytes(stored0.workspaceTar!.open())).equals(small)).toBe(true);

    const latest = await waitFor('seq 1 as latest', async () => {
      const l = await store.latest('capped');
      return l?.seq === 1 ? l : undefined;
    }, 20_000, 20);
    expect(latest.checkpoint.workspace).toEqual({ captured: false, reason: `larger than ${cap} bytes` });
    expect(latest.workspaceTar).toBeUndefined();
    expect(await readdir(latest.dir)).toEqual(['checkpoint.json']);
    expect(latest.checkpoint).toMatchObject({ episodeId: 'capped', seq: 1, turn: 1, usage: { totalTokens: 110 }, agentMs: 1_000 });
  });

  it('offer() checks the checkpoint at once, destroys the stream of a replaced offer, and refuses offers after close', async () => {
    const { prefix } = await scope();
    const s = sink(prefix);
    const tar = streamOf(await workspaceTar(8 * 1024));
    expect(() => s.offer({ ...offerOf('Bad Id', 0) }, tar)).toThrow(/episodeId: lower-case letters/);
    expect(tar.destroyed).toBe(true);
    const replaced = streamOf(await workspaceTar(8 * 1024));
    s.offer(offerOf('api', 0), undefined);
    s.offer(offerOf('api', 1), replaced);
    s.offer(offerOf('api', 2), undefined);
    expect(replaced.destroyed).toBe(true);
    expect(await s.flush('api')).toBe(2);
    // All three came before the hand-off started (it waits a turn of the event loop): only the last went.
    expect(s.stats).toMatchObject({ offered: 3, replaced: 2, handedOver: 1, failed: 0 });
    // Out of order (two getArchive calls finishing the other way round): the higher seq stays.
    s.offer(offerOf('api', 5), undefined);
    s.offer(offerOf('api', 4), undefined);
    expect(await s.flush('api')).toBe(5);
    await s.close();
    expect(() => s.offer(offerOf('api', 6), undefined)).toThrow(/closed/);
  });

  it('ignores abandoned temp folders and removes them: at once when their writer is dead, by age otherwise', async () => {
    const { dataDir } = await scope();
    const store = new FolderCheckpointStore(new FolderStore(dataDir), { staleTempMs: 60_000 });
    const dir = store.folder('temps');
    await mkdir(dir, { recursive: true });
    const dead = spawn(process.execPath, ['-e', '0']);
    await once(dead, 'exit');
    const hostTag = createHash('sha256').update(os.hostname()).digest('hex').slice(0, 8);
    const deadWriter = path.join(dir, `.tmp-3-${hostTag}-${dead.pid}-abcd`);
    const oldForeign = path.join(dir, '.tmp-3-00000000-1-abcd');
    const freshForeign = path.join(dir, '.tmp-3-00000000-2-abcd');
    for (const d of [deadWriter, oldForeign, freshForeign]) {
      await mkdir(d);
      await writeFile(path.join(d, 'checkpoint.json'), '{"episodeId": "temps", "seq": 3, "mess'); // cut off mid-write
    }
    const hourAgo = new Date(Date.now() - 3600_000);
    await utimes(oldForeign, hourAgo, hourAgo);

    expect(await store.latest('temps')).toBeUndefined();
    expect(await store.seqs('temps')).toEqual([]);
    await store.write({ ...offerOf('temps', 3), createdAt: new Date().toISOString(), workspace: { captured: false, reason: 'no snapshot offered' } });
    expect((await store.latest('temps'))?.seq).toBe(3);
    expect((await readdir(dir)).sort()).toEqual(['.tmp-3-00000000-2-abcd', '00000003', 'latest.json']);
    expect((await stat(freshForeign)).isDirectory()).toBe(true);
  });
});
