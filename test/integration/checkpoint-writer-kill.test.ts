// kill -9 of the `rollout-fleet checkpoint-writer` process mid-write, on a Redis with AOF fsync always:
// no torn or partial checkpoint is ever visible (every seq folder has a parseable checkpoint.json and a
// workspace.tar of the recorded size, latest.json points at one of them), and once a writer runs again
// every checkpoint handed over is on disk; the dead writer's temp folders are cleared; a SIGTERM'd
// writer exits 0 and releases its Redis connections.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFile, readdir, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CHECKPOINTS_QUEUE } from '../../queues/checkpoints/contract.ts';
import { Checkpoint } from '../../src/checkpoints/checkpoint.ts';
import { CheckpointSink } from '../../src/checkpoints/checkpoint-sink.ts';
import { FolderStore } from '../../src/artifacts/folder-store.ts';
import { FolderCheckpointStore } from '../../src/checkpoints/folder-checkpoint-store.ts';
import { BIN, silentLog, startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';
import { allStaged, offerOf, sha256, streamOf, workspaceTar } from '../helpers/checkpoints.ts';

const EPISODES = Array.from({ length: 12 }, (_, i) => `kill-${String(i).padStart(2, '0')}`);

describe('checkpoint writer killed mid-write', () => {
  let env: FleetEnv;
  let queue: Queue;
  let sink: CheckpointSink;
  const children: ChildProcess[] = [];

  function spawnWriter(id: string): ChildProcess {
    const child = spawn(process.execPath, [BIN, 'checkpoint-writer', '--concurrency', '4'], {
      env: { ...env.env, FLEET_WORKER_ID: id, FLEET_LOCK_DURATION_MS: '1500', FLEET_CHECKPOINT_KEEP: '5' },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
    child.once('exit', (code, signal) => {
      if (code !== 0 && signal !== 'SIGKILL') process.stderr.write(`checkpoint-writer ${id} exited ${code ?? signal}: ${err}\n`);
    });
    children.push(child);
    return child;
  }
  async function stop(child: ChildProcess, signal: NodeJS.Signals): Promise<number | null> {
    if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
    const exited = once(child, 'exit');
    child.kill(signal);
    const [code] = (await exited) as [number | null];
    return code;
  }

  beforeAll(async () => {
    env = await startFleetEnv({ durable: true });
    queue = new Queue(CHECKPOINTS_QUEUE, { connection: env.client, prefix: env.prefix });
    sink = new CheckpointSink({ connection: env.client, queue, prefix: env.prefix, log: silentLog, workspaceCapBytes: 16 * 1024 * 1024 });
  });
  afterAll(async () => {
    await Promise.all(children.map((c) => stop(c, 'SIGKILL')));
    await sink?.close();
    await queue?.close();
    await env?.close();
    if (env) await rm(env.dataDir, { recursive: true, force: true });
  });

  const store = () => new FolderCheckpointStore(new FolderStore(env.dataDir));
  const temps = async () => (await Promise.all(EPISODES.map(async (e) =>
    (await readdir(store().folder(e)).catch(() => [] as string[])).filter((n) => n.startsWith('.tmp-'))))).flat();

  /** What a reader can see is whole: every seq folder complete, latest.json pointing at one. */
  async function expectNothingTorn(): Promise<number> {
    let folders = 0;
    for (const e of EPISODES) {
      const dir = store().folder(e);
      for (const seq of await store().seqs(e)) {
        const folder = path.join(dir, String(seq).padStart(8, '0'));
        const checkpoint = Checkpoint.parse(JSON.parse(await readFile(path.join(folder, 'checkpoint.json'), 'utf8')));
        expect(checkpoint).toMatchObject({ episodeId: e, seq });
        expect(checkpoint.workspace.captured).toBe(true);
        if (checkpoint.workspace.captured) expect((await stat(path.join(folder, 'workspace.tar'))).size).toBe(checkpoint.workspace.bytes);
        folders += 1;
      }
      const pointer = await readFile(path.join(dir, 'latest.json'), 'utf8').catch(() => undefined);
      if (pointer !== undefined) expect(await store().seqs(e)).toContain((JSON.parse(pointer) as { seq: number }).seq);
    }
    return folders;
  }

  it('never shows a torn checkpoint and loses nothing handed over', { timeout: 300_000 }, async () => {
    const baselineClients = (await env.client.client('LIST') as string).trim().split('\n').length;
    // Three rounds, each killed at a different point: as soon as a job is active, while a temp folder
    // is being filled, after some of the round's checkpoints are in place.
    const rounds = [
      { bytes: 4 << 20, killWhen: async () => (await queue.getActiveCount()) > 0 },
      { bytes: 6 << 20, killWhen: async () => (await queue.getActiveCount()) > 0 && (await temps()).length > 0 },
      { bytes: 6 << 20, killWhen: async () => (await queue.getActiveCount()) > 0 && (await Promise.all(EPISODES.map((e) => store().read(e, 2)))).some(Boolean) },
    ];
    const handedOver: { episodeId: string; seq: number; sha: string }[] = [];
    for (const [seq, round] of rounds.entries()) {
      const tar = await workspaceTar(round.bytes, seq);
      for (const e of EPISODES) sink.offer(offerOf(e, seq, 50_000), streamOf(tar));
      for (const e of EPISODES) expect(await sink.flush(e)).toBe(seq);
      expect(sink.stats.failed).toBe(0);
      const jobs = await queue.getJobs(['waiting', 'active', 'delayed', 'prioritized']);
      expect(jobs.map((j) => j.id).sort()).toEqual(EPISODES.map((e) => `${e}.cp${seq}`));
      handedOver.push(...EPISODES.map((episodeId) => ({ episodeId, seq, sha: sha256(tar) })));

      const doomed = spawnWriter(`doomed-${seq}`);
      await waitFor(`round ${seq}'s kill point`, round.killWhen, 60_000, 2);
      await stop(doomed, 'SIGKILL');
      const left = (await queue.getJobCounts('waiting', 'active', 'delayed')) as Record<string, number>;
      expect(left.waiting! + left.active! + left.delayed!).toBeGreaterThan(0);
      await expectNothingTorn();

      const next = spawnWriter(`next-${seq}`);
      await waitFor(`every checkpoint of round ${seq} on disk`, async () => {
        const counts = (await queue.getJobCounts('waiting', 'active', 'delayed')) as Record<string, number>;
        return counts.waiting! + counts.active! + counts.delayed! === 0;
      }, 90_000, 100);
      expect(await expectNothingTorn()).toBe(handedOver.length);
      for (const { episodeId, seq: s, sha } of handedOver) {
        const stored = await store().read(episodeId, s);
        expect(stored, `${episodeId} seq ${s}`).toBeDefined();
        expect(stored!.checkpoint.workspace).toMatchObject({ captured: true, sha256: sha });
      }
      expect(await queue.getFailedCount()).toBe(0);
      expect(await temps()).toEqual([]);
      expect(await stop(next, 'SIGTERM')).toBe(0);
    }
    for (const e of EPISODES) expect((await store().latest(e))?.seq).toBe(2);
    expect(await allStaged(env.client, env.prefix)).toEqual([]);
    await waitFor('the writers\' Redis clients to be gone', async () =>
      (await env.client.client('LIST') as string).trim().split('\n').length <= baselineClients, 10_000);
  });
});
