// kill -9 of a worker in the middle of an llm episode that has written at least 2 checkpoints: once
// its job lock lapses another worker resumes it from the latest durable checkpoint, the model is not
// asked again for checkpointed turns, the episode passes, and its checkpoint folder is consistent.
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Checkpoint } from '../../src/checkpoints/checkpoint.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { EXAMPLES, silentLog, spawnWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

describe('resume after kill -9', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    // Durable Redis, as in production; a slow model so the kill lands mid-episode.
    env = await startFleetEnv({ durable: true });
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0, host: '127.0.0.1' }, delayMs: 1_500, log: silentLog });
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    await stub?.close();
    await env?.close();
  });

  it('resumes from the latest checkpoint without repeating checkpointed model calls', async () => {
    const workerEnv = { ...env.env, MODEL_BASE_URL: stub.baseUrl!, FLEET_LOCK_DURATION_MS: '4000', FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000' };
    const victim = spawnWorker(workerEnv, 'resume-victim');
    workers.push(victim);
    // set-port takes four turns: write the patch, write solve.sh, run it, finish.
    const file = await writeBatch(`tasks: [${JSON.stringify(path.join(EXAMPLES, 'tasks', 'set-port'))}]\nagent: { kind: llm }\n`, {});
    const plan = await enqueueFile(env, file);
    const episodeId = plan.jobs[0]!.episodeId;
    const folder = path.join(env.dataDir, 'checkpoints', episodeId);
    const latestSeq = async () => readFile(path.join(folder, 'latest.json'), 'utf8').then((t) => (JSON.parse(t) as { seq: number }).seq, () => 0);

    await waitFor('two durable checkpoints', async () => (await latestSeq()) >= 2, 90_000, 50);
    victim.child.kill('SIGKILL');
    const durableAtKill = await latestSeq();

    // What the killed worker left is consistent: every seq folder holds a complete checkpoint with
    // its workspace, and latest.json points at the highest.
    const seqs = (await readdir(folder)).filter((n) => /^\d{8}$/.test(n)).sort();
    expect(seqs.length).toBeGreaterThanOrEqual(2);
    for (const seq of seqs) {
      const cp = Checkpoint.parse(JSON.parse(await readFile(path.join(folder, seq, 'checkpoint.json'), 'utf8')));
      expect(cp.seq).toBe(Number(seq));
      expect(cp.workspace.captured).toBe(true);
    }
    expect(durableAtKill).toBe(Number(seqs.at(-1)));

    workers.push(spawnWorker(workerEnv, 'resume-rescuer'));
    const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(result).toMatchObject({ status: 'passed', reward: 1, workerId: 'resume-rescuer', attempts: 2 });
    expect(result!.resumedFrom).toBeGreaterThanOrEqual(durableAtKill);

    // The model saw each checkpointed turn once; only the turn in flight at the kill may repeat.
    const calls = stub.calls().filter((c) => c.episodeId === episodeId);
    for (const c of calls) {
      if (c.turn < result!.resumedFrom!) expect(c.count, `turn ${c.turn}`).toBe(1);
    }
    expect(calls.map((c) => c.turn)).toEqual([0, 1, 2, 3]);

    // Once the episode has its result, its checkpoints are removed (just after the result is recorded,
    // behind the fence that removes a late writer's checkpoint again).
    await waitFor('the checkpoint folder removed', async () => readdir(folder).then(() => false, (err: NodeJS.ErrnoException) => err.code === 'ENOENT'), 30_000, 50);
    await waitForNoContainers(plan.batchId);
  });
});
