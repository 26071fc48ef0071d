// `rollout-fleet retry <batch> --kind infra` re-enqueues only the episodes that ended with that kind;
// every other result stays as it was. The retried job stays its batch's child (the summary follows
// the new result), and a retry cut short between its steps never leaves an episode with neither a
// job nor a result.
import { Job, Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { BATCHES_QUEUE } from '../../queues/batches/contract.ts';
import { EPISODES_QUEUE } from '../../queues/episodes/contract.ts';
import { EpisodeControl } from '../../src/episode/episode-control.ts';
import { prepareRetry, requeueInPlace, type RetryDeps } from '../../src/producer/retry-by-kind.ts';
import { bullmqJobKey, taskArchiveKey } from '../../src/redis/redis-keys.ts';
import { runCli, spawnWorker, startFleetEnv, waitFor, waitForNoContainers, type FleetEnv, type WorkerProcess, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const task = (id: string) => ({
  yaml: `id: ${id}\ninstruction: x\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\n`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
});

/** An engine that answers nothing in time (a 1 ms deadline on every Docker call), no infra retries: kind infra. */
const BROKEN_ENGINE = { FLEET_DOCKER_CALL_TIMEOUT_MS: '1', FLEET_INFRA_RETRIES: '0' };

describe('retry by kind', () => {
  let env: FleetEnv;
  let batches: Queue;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    batches = new Queue(BATCHES_QUEUE, { connection: env.client, prefix: env.prefix });
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    await batches?.close();
    await env?.close();
  });

  /**
   * Whether the episode's job is its batch's child both ways: the job names the batch's parent job, and
   * the parent counts the job among its children (processed or not).
   */
  async function parentHasChild(batchId: string, episodeId: string): Promise<boolean> {
    const child = await env.episodes.getJob(episodeId);
    if (child?.parentKey !== bullmqJobKey(env.prefix, BATCHES_QUEUE, batchId)) return false;
    const parent = await Job.fromId(batches, batchId);
    const deps = await parent!.getDependencies();
    const key = bullmqJobKey(env.prefix, EPISODES_QUEUE, episodeId);
    return Object.keys(deps.processed ?? {}).includes(key) || (deps.unprocessed ?? []).includes(key);
  }

  it('requeues the infra failures and keeps the rest; the batch keeps the episode and its summary follows', async () => {
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "echo fixed > state.txt" }\n', { good: task('good'), lost: task('lost') });
    const plan = await enqueueFile(env, file);
    const lost = plan.jobs.find((j) => j.task.id === 'lost')!;
    const good = plan.jobs.find((j) => j.task.id === 'good')!;
    // `lost` loses its task archive: invalid input. `good` meets a broken engine: kind infra.
    await env.client.del(taskArchiveKey(env.prefix, lost.taskDigest));
    const broken = spawnWorker({ ...env.env, ...BROKEN_ENGINE }, 'broken-engine');
    workers.push(broken);
    const first = await waitFor('both results', async () => {
      const r = await env.results.results(plan.batchId);
      return r.length === 2 ? r : undefined;
    }, 60_000, 200);
    expect(Object.fromEntries(first.map((r) => [r.taskId, r.error?.kind]))).toEqual({ good: 'infra', lost: 'invalid' });
    const lostBefore = first.find((r) => r.taskId === 'lost');
    // The batch ended: its parent ran and stored the summary.
    const summaryBefore = await waitFor('the batch summary', () => env.results.storedSummary(plan.batchId), 30_000);
    expect(summaryBefore.byStatus).toMatchObject({ passed: 0, error: 2 });
    expect(await broken.stop()).toBe(0);

    const run = await runCli(['retry', plan.batchId, '--kind', 'infra'], env.env);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain(`${good.episodeId}: requeued`);
    expect(run.stdout).toContain('1 episode(s) of kind infra requeued');
    // Retried in place: the same job, still a child of its batch (a job re-added without its parent
    // was lost to the batch's flow).
    expect(await parentHasChild(plan.batchId, good.episodeId)).toBe(true);

    workers.push(spawnWorker(env.env, 'healthy'));
    const after = await waitFor('good to pass', async () => {
      const r = await env.results.results(plan.batchId);
      return r.find((x) => x.taskId === 'good')?.status === 'passed' ? r : undefined;
    }, 60_000, 200);
    expect(after.find((r) => r.taskId === 'good')).toMatchObject({ status: 'passed', reward: 1, workerId: 'healthy', attempts: 2 });
    expect(after.find((r) => r.taskId === 'lost')).toEqual(lostBefore);
    expect(await parentHasChild(plan.batchId, good.episodeId)).toBe(true);
    await waitFor('the summary to count the pass', async () => (await env.results.storedSummary(plan.batchId))?.byStatus.passed === 1, 30_000);
    await waitForNoContainers(plan.batchId);
    await Promise.all(workers.splice(0).map((w) => w.stop()));
  });

  it('a retry cut short between its steps leaves the old result or a requeued job, never neither', async () => {
    const file = await writeBatch('name: cut-short\ntasks: [tasks]\nagent: { kind: command, command: "echo fixed > state.txt" }\n', { flaky: task('flaky') });
    const plan = await enqueueFile(env, file);
    const { episodeId } = plan.jobs[0]!;
    const broken = spawnWorker({ ...env.env, ...BROKEN_ENGINE }, 'broken-engine-2');
    const [before] = await waitFor('the infra failure', async () => {
      const r = await env.results.results(plan.batchId);
      return r.length === 1 ? r : undefined;
    }, 60_000, 200);
    expect(before?.error?.kind).toBe('infra');
    expect(await broken.stop()).toBe(0);
    const deps: RetryDeps = { queue: env.episodes, redis: env.client, prefix: env.prefix, results: env.results, control: new EpisodeControl(env.client, env.prefix) };
    const job = (await env.episodes.getJob(episodeId))!;

    // Cut after step 1: nothing a reader sees has changed.
    await prepareRetry(deps, episodeId);
    expect(await env.results.get(plan.batchId, episodeId)).toEqual(before);
    expect(await job.getState()).toBe('completed');

    // Cut after step 2 (before the result is forgotten): the old result beside a waiting job.
    expect(await requeueInPlace(deps, job)).toBe(true);
    expect(await env.results.get(plan.batchId, episodeId)).toEqual(before);
    expect(await job.getState()).toBe('waiting');
    expect(await parentHasChild(plan.batchId, episodeId)).toBe(true);

    // The worker that picks it up forgets the superseded result and runs the episode for real.
    const healthy = spawnWorker(env.env, 'healthy-2');
    workers.push(healthy);
    const result = await waitFor('a new result', async () => {
      const r = await env.results.get(plan.batchId, episodeId);
      return r?.status === 'passed' ? r : undefined;
    }, 60_000, 200);
    expect(result).toMatchObject({ status: 'passed', reward: 1, workerId: 'healthy-2' });
    await waitFor('the summary to count the pass', async () => (await env.results.storedSummary(plan.batchId))?.byStatus.passed === 1, 30_000);
    await waitForNoContainers(plan.batchId);
  });
});
