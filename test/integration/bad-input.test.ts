// Bad input gets a clear error naming the file, field and value, and loses nothing: a malformed batch
// or task is rejected before anything is enqueued; a malformed episode fails alone, without retries.
import { cp, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { episodeJobOptions } from '../../queues/episodes/contract.ts';
import { planBatch, storeTaskArchives } from '../../src/producer/enqueue-batch.ts';
import { fleetKeyPattern } from '../../src/redis/redis-keys.ts';
import { loadBatch } from '../../src/tasks/load-task.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { EXAMPLES, runCli, startFleetEnv, waitFor, waitForResults, type FleetEnv, startEnvWorker } from '../helpers/fleet.ts';

/** A temp folder with copies of example tasks and a batch file naming them. */
async function scratchBatch(batchYaml: string, edit?: { task: string; from: string; to: string }): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-batch-'));
  await cp(path.join(EXAMPLES, 'tasks'), path.join(dir, 'tasks'), { recursive: true });
  if (edit) {
    const file = path.join(dir, 'tasks', edit.task, 'task.yaml');
    const text = await readFile(file, 'utf8');
    if (!text.includes(edit.from)) throw new Error(`${file} has no ${edit.from}`);
    await writeFile(file, text.replace(edit.from, edit.to));
  }
  const batch = path.join(dir, 'batch.yaml');
  await writeFile(batch, batchYaml);
  return batch;
}

const GOOD_BATCH = 'name: bad-input\ntasks: [tasks]\nsamples: 1\nagent: { kind: oracle }\n';

describe('bad input', () => {
  let env: FleetEnv;

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await env?.close();
  });

  async function expectRejected(batch: string, ...fragments: string[]) {
    const run = await runCli(['enqueue', batch], env.env);
    expect(run.code).toBe(2);
    for (const f of fragments) expect(run.stderr).toContain(f);
    expect(run.stdout).toBe('');
    // Nothing of the batch reached Redis: no job, no manifest, no task archive.
    expect(await env.episodes.getJobCounts()).toMatchObject({ waiting: 0, active: 0, completed: 0, failed: 0, delayed: 0 });
    // (The queues' own :meta keys exist from the moment a Queue object is made.)
    expect((await env.client.keys(fleetKeyPattern(env.prefix))).filter((k) => !k.endsWith(':meta'))).toEqual([]);
  }

  it('rejects a malformed batch file naming file, field and value', async () => {
    const batch = await scratchBatch('tasks: [tasks]\nsamples: two\nagent: { kind: oracle }\n');
    await expectRejected(batch, `${batch}: samples:`, '(got "two")');
  });

  it('rejects an unknown agent kind', async () => {
    const batch = await scratchBatch('tasks: [tasks]\nagent: { kind: wizard }\n');
    await expectRejected(batch, `${batch}: agent.kind:`, '(got "wizard")');
  });

  it('rejects the whole batch when one task.yaml is malformed', async () => {
    const batch = await scratchBatch(GOOD_BATCH, { task: 'set-port', from: 'timeoutSec: 20', to: 'timeoutSec: -5' });
    await expectRejected(batch, path.join(path.dirname(batch), 'tasks/set-port/task.yaml'), 'verify.timeoutSec:', '(got -5)');
  });

  it('rejects a deadline that leaves the agent no time after the reserves', async () => {
    const batch = await scratchBatch(GOOD_BATCH, { task: 'sum-column', from: 'deadlineSec: 180', to: 'deadlineSec: 100' });
    await expectRejected(batch, 'tasks/sum-column/task.yaml: deadlineSec: leaves the agent no time', '(got 100)');
  });

  it('rejects a task whose image is not on the engine', async () => {
    const batch = await scratchBatch(`${GOOD_BATCH}defaults: { image: "rollout-fleet/absent:1" }\n`);
    await expectRejected(batch, 'task.yaml: image: not found on the Docker engine (got "rollout-fleet/absent:1")');
  });

  it('fails a malformed payload or a missing image alone, without retries, and keeps working', async () => {
    let worker: WorkerHandle | undefined;
    const baseline = ((await env.client.client('LIST')) as string).trim().split('\n').length;
    try {
      worker = await startEnvWorker(env, 'bad-input-w');
      const plan = await planBatch(await loadBatch(await scratchBatch(GOOD_BATCH)));
      const good = plan.jobs.find((j) => j.task.id === 'fix-greeting')!;
      const noImage = { ...plan.jobs.find((j) => j.task.id === 'set-port')!, task: { ...good.task, id: 'set-port', image: 'rollout-fleet/absent:1' } };
      await storeTaskArchives(plan, env.client, env.prefix);
      // An image name the engine would answer 400 to: refused by the job parser, not retried as infra.
      const badImage = { ...plan.jobs.find((j) => j.task.id === 'sum-column')!, task: { ...good.task, id: 'sum-column', image: 'Rollout-Fleet/Sandbox:BusyBox' } };
      await env.results.putManifest({ batchId: plan.batchId, name: plan.name, createdAt: new Date().toISOString(), episodeIds: ['junk', noImage.episodeId, good.episodeId, badImage.episodeId] });

      const junk = { batchId: plan.batchId, task: { id: 'x' }, sample: 'first' };
      await env.episodes.add('junk', junk, { ...episodeJobOptions, jobId: 'junk' });
      await env.episodes.add('no-image', noImage, { ...episodeJobOptions, jobId: noImage.episodeId });
      await env.episodes.add('good', good, { ...episodeJobOptions, jobId: good.episodeId });
      await env.episodes.add('bad-image', badImage, { ...episodeJobOptions, jobId: badImage.episodeId });

      const [rJunk, rNoImage, rGood, rBadImage] = await waitForResults(env, plan.batchId, 4);
      expect(rBadImage).toMatchObject({ episodeId: badImage.episodeId, status: 'error', attempts: 1, error: { kind: 'invalid', code: 'invalid_payload' } });
      expect(rBadImage!.error!.message).toContain('task.image: not a valid image reference');
      expect(rJunk).toMatchObject({ episodeId: 'junk', status: 'error', attempts: 1, error: { kind: 'invalid', code: 'invalid_payload' } });
      expect(rJunk!.error!.message).toContain('sample: Invalid input: expected number, received string (got "first")');
      expect(rJunk!.error!.message).toContain('episodeId:');
      expect(rNoImage).toMatchObject({ status: 'error', attempts: 1, error: { kind: 'invalid', code: 'image_not_found' } });
      expect(rNoImage!.error!.message).toContain('image rollout-fleet/absent:1 not found');
      expect(rGood).toMatchObject({ status: 'passed', reward: 1, attempts: 1 });
      // Neither bad job was retried: each ended on its first attempt.
      for (const id of ['junk', noImage.episodeId, badImage.episodeId]) expect((await env.episodes.getJob(id))?.attemptsMade).toBeLessThanOrEqual(1);
    } finally {
      await worker?.close();
    }
    // startWorker().close() releases every connection it opened.
    await waitFor('worker connections to close', async () =>
      ((await env.client.client('LIST')) as string).trim().split('\n').length === baseline, 10_000);
  });
});
