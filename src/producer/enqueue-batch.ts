// Turns a loaded batch into episode jobs and enqueues them all or nothing: every task is packed and
// checked first, the batch id is derived from the batch's content (so enqueueing the same batch twice
// names the same batch, which is then not added again), then the batch goes in as one flow: a parent
// job in the `batches` queue with the episodes as its children.
import { createHash } from 'node:crypto';
import path from 'node:path';
import type { FlowProducer } from 'bullmq';
import { BATCHES_QUEUE, batchJobOptions, type BatchJob } from '../../queues/batches/contract.ts';
import type { Redis } from 'ioredis';
import { EPISODES_QUEUE, EpisodeJob, episodeJobOptions } from '../../queues/episodes/contract.ts';
import { FleetError } from '../errors/fleet-error.ts';
import type { ResultsStore } from '../results/results-store.ts';
import type { LoadedBatch } from '../tasks/load-task.ts';
import { packTask, type PackedTask } from '../tasks/pack-task.ts';
import { putTaskArchive } from '../tasks/task-store.ts';

export interface BatchPlan {
  batchId: string;
  name: string;
  jobs: EpisodeJob[];
  packed: PackedTask[];
}

export interface EnqueueDeps {
  flows: FlowProducer;
  redis: Redis;
  prefix: string;
  results: ResultsStore;
  /** true/false when the engine could be asked; undefined when it cannot be checked from here. */
  imageExists?: (image: string) => Promise<boolean | undefined>;
}

/** Pack every task and build the jobs; touches nothing outside this process. */
export async function planBatch(loaded: LoadedBatch, now = new Date()): Promise<BatchPlan> {
  const { batch } = loaded;
  const name = batch.name ?? path.basename(loaded.file).replace(/\.ya?ml$/, '').toLowerCase().replace(/[^a-z0-9_-]/g, '-').slice(0, 40);
  const packedTasks = await Promise.all(loaded.tasks.map(async (t) => ({ task: t, packed: await packTask(t.dir) })));
  const identity = JSON.stringify({
    name,
    samples: batch.samples,
    agent: batch.agent,
    tasks: packedTasks.map(({ task, packed }) => ({ spec: task.spec, digest: packed.digest })),
  });
  const batchId = `${name}-${createHash('sha256').update(identity).digest('hex').slice(0, 12)}`;
  const jobs: EpisodeJob[] = [];
  for (const { task, packed } of packedTasks) {
    for (let sample = 0; sample < batch.samples; sample++) {
      jobs.push(
        EpisodeJob.parse({
          episodeId: `${batchId}.${task.spec.id}.${sample}`,
          batchId,
          sample,
          task: task.spec,
          taskDigest: packed.digest,
          agent: batch.agent,
          enqueuedAt: now.toISOString(),
        }),
      );
    }
  }
  return { batchId, name, jobs, packed: packedTasks.map((p) => p.packed) };
}

export interface EnqueuedBatch extends BatchPlan {
  /** false when this batch was enqueued before: nothing was added. */
  added: boolean;
}

/** Check images (when possible), store task archives and the manifest, then add the batch's flow. */
export async function enqueueBatch(loaded: LoadedBatch, deps: EnqueueDeps): Promise<EnqueuedBatch> {
  const plan = await planBatch(loaded);
  if (deps.imageExists) {
    for (const task of loaded.tasks) {
      if ((await deps.imageExists(task.spec.image)) === false) {
        throw new FleetError(
          'image_not_found',
          `${path.join(task.dir, 'task.yaml')}: image: not found on the Docker engine (got ${JSON.stringify(task.spec.image)})`,
        );
      }
    }
  }
  for (const packed of plan.packed) await putTaskArchive(deps.redis, deps.prefix, packed);
  const first = await deps.results.putManifest({
    batchId: plan.batchId,
    name: plan.name,
    createdAt: new Date().toISOString(),
    episodeIds: plan.jobs.map((j) => j.episodeId),
  });
  // The manifest goes first: a second enqueue of the same batch (or a retry of an interrupted one
  // whose flow did land) finds the parent job and adds nothing.
  if (!first && (await deps.flows.getFlow({ id: plan.batchId, queueName: BATCHES_QUEUE, prefix: deps.prefix, depth: 0 }).catch(() => undefined))?.job) {
    return { ...plan, added: false };
  }
  const parent: BatchJob = { batchId: plan.batchId, name: plan.name, total: plan.jobs.length };
  await deps.flows.add({
    name: 'batch',
    queueName: BATCHES_QUEUE,
    data: parent,
    opts: { ...batchJobOptions, jobId: plan.batchId },
    children: plan.jobs.map((data) => ({
      name: data.task.id,
      queueName: EPISODES_QUEUE,
      data,
      // A child that fails outright (it stalled too often) must not hold the batch's summary back.
      opts: { ...episodeJobOptions, jobId: data.episodeId, ignoreDependencyOnFailure: true },
    })),
  });
  return { ...plan, added: true };
}
