// Turns a loaded batch into episode jobs and enqueues them all or nothing: every task is packed and
// checked first, the batch id is derived from the batch's content (so enqueueing the same batch twice
// names the same batch, which is then not added again), then the batch goes in as one flow: a parent
// job in the `batches` queue with the episodes as its children (a batch of more than ONE_FLOW_MAX
// episodes in chunks, the parent held back by a gate until the last chunk is in: see addGated).
import { createHash } from 'node:crypto';
import path from 'node:path';
import type { FlowProducer, JobsOptions } from 'bullmq';
import { BATCH_GATES_QUEUE, BATCHES_QUEUE, batchJobOptions, type BatchJob } from '../results/batch-job.ts';
import type { Redis } from 'ioredis';
import { EPISODES_QUEUE, EpisodeJob, episodeJobOptions } from '../episode/episode-job.ts';
import { describeIssues, shownValue } from '../config/zod-issues.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { printable } from '../errors/printable.ts';
import type { ResultsStore } from '../results/results-store.ts';
import { batchNameFromFile, type LoadedBatch } from '../tasks/load-task.ts';
import { digestTask, packTask } from '../tasks/pack-task.ts';
import { putTaskArchive, touchTaskArchive } from '../tasks/task-store.ts';
import { DEFAULT_ENDPOINT } from '../config/model-endpoints.ts';

/** A task of the plan: its folder (none for a stored task) and the digest its archive had when the plan was made. */
export interface PlannedTask {
  dir?: string;
  digest: string;
}

export interface BatchPlan {
  batchId: string;
  name: string;
  /** The batch's passThreshold, when it sets one. */
  passThreshold?: number;
  jobs: EpisodeJob[];
  tasks: PlannedTask[];
}

/**
 * What one batch may add to Redis in episode jobs: each carries its task's spec (the instruction
 * included), so samples multiply it. Past this, the producer's memory and Redis's grow with it.
 */
export const MAX_BATCH_JOB_BYTES = 64 * 1024 * 1024;

export interface EnqueueDeps {
  flows: FlowProducer;
  redis: Redis;
  prefix: string;
  results: ResultsStore;
  /** true/false when the engine could be asked; undefined when it cannot be checked from here. */
  imageExists?: (image: string) => Promise<boolean | undefined>;
}

function invalidBatch(file: string, message: string): FleetError {
  return new FleetError('invalid_task', `${printable(file)}: ${message}`);
}

/**
 * Digest every task (one at a time, keeping no archive: memory stays that of one task) and build the
 * jobs; touches nothing outside this process.
 */
export async function planBatch(loaded: LoadedBatch, now = new Date()): Promise<BatchPlan> {
  const { batch } = loaded;
  const name = batch.name ?? batchNameFromFile(loaded.file);
  if (name === undefined) throw invalidBatch(loaded.file, 'name: missing, and the file name gives none: set name: (got nothing)');
  const tasks: Array<PlannedTask & { spec: LoadedBatch['tasks'][number]['spec'] }> = [];
  for (const t of loaded.tasks) tasks.push({ ...(t.dir !== undefined && { dir: t.dir }), spec: t.spec, digest: t.digest ?? (await digestTask(t.dir)) });
  const identity = JSON.stringify({
    name,
    samples: batch.samples,
    agent: batch.agent,
    ...(batch.model && { model: batch.model }),
    // Only when set: a batch without one keeps the id it had before the field existed.
    ...(batch.passThreshold !== undefined && { passThreshold: batch.passThreshold }),
    ...(batch.maxStaleness !== undefined && { maxStaleness: batch.maxStaleness }),
    ...(batch.maxStaleRestarts !== undefined && { maxStaleRestarts: batch.maxStaleRestarts }),
    ...(batch.agentProcesses !== undefined && { agentProcesses: batch.agentProcesses }),
    tasks: tasks.map(({ spec, digest }) => ({ spec, digest })),
  });
  const batchId = `${name}-${createHash('sha256').update(identity).digest('hex').slice(0, 12)}`;
  // Measured before the jobs exist: one job per task tells the size of all its samples.
  let jobBytes = 0;
  for (const { spec, digest } of tasks) {
    const one = { episodeId: `${batchId}.${spec.id}.${batch.samples - 1}`, batchId, sample: batch.samples - 1, task: spec, taskDigest: digest, agent: batch.agent, ...(batch.model && { model: batch.model }), ...(batch.passThreshold !== undefined && { passThreshold: batch.passThreshold }), enqueuedAt: now.toISOString() };
    jobBytes += Buffer.byteLength(JSON.stringify(one)) * batch.samples;
  }
  if (jobBytes > MAX_BATCH_JOB_BYTES) {
    throw invalidBatch(
      loaded.file,
      `samples: ${batch.samples} samples of ${tasks.length} task(s) make ${jobBytes} bytes of episode jobs, more than the ${MAX_BATCH_JOB_BYTES} a batch may add to Redis (fewer samples, shorter instructions, or several batches) (got ${batch.samples})`,
    );
  }
  const jobs: EpisodeJob[] = [];
  const enqueuedAt = now.toISOString();
  for (const { spec, digest } of tasks) {
    const job = (sample: number) => ({
      episodeId: `${batchId}.${spec.id}.${sample}`,
      batchId,
      sample,
      task: spec,
      taskDigest: digest,
      agent: batch.agent,
      ...(batch.model && { model: batch.model }),
      ...(batch.passThreshold !== undefined && { passThreshold: batch.passThreshold }),
      ...(batch.maxStaleness !== undefined && { maxStaleness: batch.maxStaleness }),
      ...(batch.maxStaleRestarts !== undefined && { maxStaleRestarts: batch.maxStaleRestarts }),
      ...(batch.agentProcesses !== undefined && { agentProcesses: batch.agentProcesses }),
      enqueuedAt,
    });
    // A task's jobs differ in their id and sample only: when its first and last sample (the longest id)
    // pass the schema, every sample between does, and its job is the first one's with those two fields.
    // Two parses per task instead of one per episode (100,000 of them took a second), and the samples
    // share the parsed task and agent.
    const first = EpisodeJob.safeParse(job(0));
    const last = EpisodeJob.safeParse(job(batch.samples - 1));
    if (first.success && last.success) {
      for (let sample = 0; sample < batch.samples; sample++) jobs.push(sample === 0 ? first.data : { ...first.data, episodeId: `${batchId}.${spec.id}.${sample}`, sample });
      continue;
    }
    for (let sample = 0; sample < batch.samples; sample++) {
      const parsed = EpisodeJob.safeParse(job(sample));
      // The batch and task schemas should make this impossible; if they do not, say so, without a stack.
      if (!parsed.success) throw invalidBatch(loaded.file, `cannot make episode jobs: ${describeIssues(parsed.error, spec).join('; ')}`);
      jobs.push(parsed.data);
    }
  }
  return { batchId, name, ...(batch.passThreshold !== undefined && { passThreshold: batch.passThreshold }), jobs, tasks: tasks.map(({ dir, digest }) => ({ ...(dir !== undefined && { dir }), digest })) };
}

/**
 * Pack each planned task again and store it, one at a time; a folder that changed since the plan is
 * refused (its jobs name the old digest). A stored task has its expiry pushed back, and is refused if
 * it expired since it was read.
 */
export async function storeTaskArchives(plan: Pick<BatchPlan, 'tasks'>, redis: Redis, prefix: string): Promise<void> {
  for (const { dir, digest } of plan.tasks) {
    if (dir === undefined) {
      if (!(await touchTaskArchive(redis, prefix, digest))) throw new FleetError('invalid_task', `tasks: the stored task ${digest} expired while the batch was being enqueued; upload it again`);
      continue;
    }
    const packed = await packTask(dir);
    if (packed.digest !== digest) throw invalidBatch(dir, 'changed while the batch was being enqueued; enqueue it again');
    await putTaskArchive(redis, prefix, packed);
  }
}

/**
 * A batch that names its endpoint (`model.endpoint`) is refused when no live worker has it in its
 * table (host facts). Not checked when no live worker reports its endpoints (none runs yet, or all are
 * of a version before the table): a worker without the endpoint then fails the episode as
 * unknown_endpoint (see set-up-phase.ts), never with a reward.
 */
async function checkEndpoint(loaded: LoadedBatch, deps: Pick<EnqueueDeps, 'redis' | 'prefix'>): Promise<void> {
  const name = loaded.batch.model?.endpoint;
  if (name === undefined) return;
  // Loaded only here: the host facts module brings the Docker client, which the client's paths do not need.
  const { endpointOnSomeWorker, readHostFacts } = await import('../worker/host-facts.ts');
  const facts = await readHostFacts(deps.redis, deps.prefix).catch(() => []);
  if (endpointOnSomeWorker(facts, name) !== false) return;
  const known = [...new Set(facts.flatMap((f) => f.modelEndpoints ?? []))].sort();
  throw invalidBatch(
    loaded.file,
    `model.endpoint: no live worker has the endpoint ${JSON.stringify(name)} in its table (FLEET_MODEL_ENDPOINTS); the ${facts.length} live worker(s) have ${known.length === 0 ? 'none' : known.map((k) => JSON.stringify(k)).join(', ')} (got ${JSON.stringify(name)})`,
  );
}

/** How long a second enqueue of a batch waits for the first one's flow before adding it itself. */
const FLOW_WAIT_MS = 5_000;

/** Whether the batch's parent job exists, polled for up to `waitMs`. */
async function flowLanded(deps: EnqueueDeps, batchId: string, waitMs: number): Promise<boolean> {
  const until = Date.now() + waitMs;
  for (let every = 25; ; every = Math.min(every * 2, 500)) {
    if (await jobExists(deps, BATCHES_QUEUE, batchId)) return true;
    if (Date.now() >= until) return false;
    await new Promise((resolve) => setTimeout(resolve, every));
  }
}

export interface EnqueuedBatch extends BatchPlan {
  /** false when this batch was enqueued before: nothing was added. */
  added: boolean;
}

/**
 * The largest batch added as one flow (one MULTI: the parent and every episode at once). A larger one
 * goes in chunks behind a gate (see addGated): one MULTI of 100,000 jobs held the producer at 1.5 GB,
 * blocked Redis for seconds while it ran and took 2-4x the time of addBulk; from a few hundred
 * episodes on, chunks are faster than one flow too.
 */
export const ONE_FLOW_MAX = 100;

/** Episodes per `addBulk` of a batch added in chunks. */
export const ENQUEUE_CHUNK = 1_000;

/** Check images (when possible), store task archives and the manifest, then add the batch's jobs. */
export async function enqueueBatch(loaded: LoadedBatch, deps: EnqueueDeps, opts: { oneFlowMax?: number; chunk?: number } = {}): Promise<EnqueuedBatch> {
  const plan = await planBatch(loaded);
  if (deps.imageExists) {
    for (const task of loaded.tasks) {
      // A Harbor task with environment/Dockerfile is built where it runs: its image need not exist yet.
      if (task.spec.harbor?.build !== undefined) continue;
      if ((await deps.imageExists(task.spec.image)) === false) {
        const harbor = task.spec.harbor !== undefined;
        throw new FleetError(
          'image_not_found',
          `${task.dir === undefined ? `${printable(loaded.file)}: task ${task.spec.id} (${task.digest})` : printable(path.join(task.dir, harbor ? 'task.toml' : 'task.yaml'))}: ${harbor ? 'environment.docker_image' : 'image'}: not found on the Docker engine${harbor ? ', and the task has no environment/Dockerfile to build it from' : ''} (got ${shownValue(task.spec.image)})`,
        );
      }
    }
  }
  await checkEndpoint(loaded, deps);
  await storeTaskArchives(plan, deps.redis, deps.prefix);
  const first = await deps.results.putManifest({
    batchId: plan.batchId,
    name: plan.name,
    createdAt: new Date().toISOString(),
    episodeIds: plan.jobs.map((j) => j.episodeId),
    ...(plan.passThreshold !== undefined && { passThreshold: plan.passThreshold }),
    model: { endpoint: loaded.batch.model?.endpoint ?? DEFAULT_ENDPOINT, ...(loaded.batch.model?.name !== undefined && { name: loaded.batch.model.name }) },
  });
  // The manifest goes first: a second enqueue of the same batch (or a retry of an interrupted one
  // whose flow did land) finds the parent job and adds nothing. One that finds the manifest but no parent
  // is either racing the first enqueue (which is adding it now) or retrying one that died before the
  // flow: it waits a little for the parent to appear, and adds the batch only if it does not. A parent
  // still behind its gate is being added in chunks, or was interrupted half-way: it is completed (the
  // episodes already there are not added twice; the gate goes once every one is in).
  let gated = false;
  if (!first && (await flowLanded(deps, plan.batchId, FLOW_WAIT_MS))) {
    gated = await jobExists(deps, BATCH_GATES_QUEUE, plan.batchId);
    if (!gated) return { ...plan, added: false };
  }
  const parent: BatchJob = { batchId: plan.batchId, name: plan.name, total: plan.jobs.length };
  const child = (data: EpisodeJob) => ({
    name: data.task.id,
    data,
    // A child that fails outright (it stalled too often) must not hold the batch's summary back.
    opts: { ...episodeJobOptions, jobId: data.episodeId, ignoreDependencyOnFailure: true },
  });
  // A gate left by an interrupted enqueue is removed by the chunked path, whatever the batch's size.
  if (plan.jobs.length <= (opts.oneFlowMax ?? ONE_FLOW_MAX) && !gated) {
    await deps.flows.add({
      name: 'batch',
      queueName: BATCHES_QUEUE,
      data: parent,
      opts: { ...batchJobOptions, jobId: plan.batchId },
      children: plan.jobs.map((data) => ({ ...child(data), queueName: EPISODES_QUEUE })),
    });
  } else {
    await addGated(plan, parent, child, deps, opts.chunk ?? ENQUEUE_CHUNK);
  }
  return { ...plan, added: true };
}

async function jobExists(deps: EnqueueDeps, queueName: string, jobId: string): Promise<boolean> {
  return (await deps.flows.getFlow({ id: jobId, queueName, prefix: deps.prefix, depth: 0 }).catch(() => undefined))?.job !== undefined;
}

/**
 * A large batch: the parent goes in with one child, its gate, as a flow; then the episodes in chunks
 * (`Queue.addBulk`, each naming the parent; an episode already there, from an interrupted enqueue, is
 * not added twice); then the gate is removed, which lets the parent run once every episode has ended
 * (at once if all had). Until then the parent waits whatever its episodes do, so it never summarizes
 * a part of its batch. Interrupted, a batch keeps its gate, and enqueueing it again completes it.
 */
async function addGated(
  plan: BatchPlan,
  parent: BatchJob,
  child: (data: EpisodeJob) => { name: string; data: EpisodeJob; opts: JobsOptions },
  deps: EnqueueDeps,
  chunk: number,
): Promise<void> {
  // BullMQ loads here only (the client's status path loads none of it).
  const { Queue } = await import('bullmq');
  await deps.flows.add({
    name: 'batch',
    queueName: BATCHES_QUEUE,
    data: parent,
    opts: { ...batchJobOptions, jobId: plan.batchId },
    children: [{ name: 'gate', queueName: BATCH_GATES_QUEUE, data: { batchId: plan.batchId }, opts: { jobId: plan.batchId } }],
  });
  const episodes = new Queue(EPISODES_QUEUE, { connection: deps.redis, prefix: deps.prefix });
  const gates = new Queue(BATCH_GATES_QUEUE, { connection: deps.redis, prefix: deps.prefix });
  for (const q of [episodes, gates]) q.on('error', () => undefined);
  try {
    const parentRef = { id: plan.batchId, queue: `${deps.prefix}:${BATCHES_QUEUE}` };
    for (let i = 0; i < plan.jobs.length; i += chunk) {
      const part = plan.jobs.slice(i, i + chunk);
      const added = await episodes.addBulk(part.map((data) => {
        const c = child(data);
        return { ...c, opts: { ...c.opts, parent: parentRef } };
      }));
      // addBulk reports a refused job (its parent gone, -5; another parent's, -7) as a negative id.
      const refused = added.findIndex((job, k) => job.id !== part[k]!.episodeId);
      if (refused !== -1) throw new Error(`enqueue ${plan.batchId}: episode ${part[refused]!.episodeId} was not added (BullMQ code ${added[refused]!.id})`);
    }
    await gates.remove(plan.batchId);
  } finally {
    await Promise.all([episodes.close(), gates.close()]);
  }
}
