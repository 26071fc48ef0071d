// A worker process's queues: episodes (the main work), cleanup (sandbox removal) and checkpoints (the
// background writer). Everything it needs is passed in; closing waits for running jobs, then
// releases every connection it opened.
import { Queue, Worker, type Job } from 'bullmq';
import type Docker from 'dockerode';
import { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { CHECKPOINTS_QUEUE } from '../../queues/checkpoints/contract.ts';
import { checkpointProcessor } from '../../queues/checkpoints/processor.ts';
import { CLEANUP_QUEUE, CleanupJob, cleanupJobId, cleanupJobOptions } from '../../queues/cleanup/contract.ts';
import { cleanupProcessor } from '../../queues/cleanup/processor.ts';
import { EPISODES_QUEUE, EpisodeJob, episodeJobOptions } from '../../queues/episodes/contract.ts';
import { episodeProcessor, invalidPayloadResult } from '../../queues/episodes/processor.ts';
import { CheckpointStore } from '../checkpoints/checkpoint-store.ts';
import { EvidenceStore } from '../evidence/evidence-store.ts';
import { ResultsStore } from '../results/results-store.ts';

export interface WorkerOptions {
  redisUrl: string;
  prefix: string;
  dataDir: string;
  docker: Docker;
  log: Logger;
  workerId: string;
  concurrency: number;
  callTimeoutMs: number;
  outputCapBytes: number;
}

export interface WorkerHandle {
  workerId: string;
  /** Stop taking jobs, let running ones finish, close every connection. */
  close(): Promise<void>;
}

export async function startWorker(opts: WorkerOptions): Promise<WorkerHandle> {
  const { prefix, log, workerId } = opts;
  const connection = new Redis(opts.redisUrl, { maxRetriesPerRequest: null, connectionName: `rf-worker-${workerId}` });
  connection.on('error', (err) => log.warn({ err: err.message }, 'redis connection error'));
  const results = new ResultsStore(connection, prefix, opts.dataDir);
  const cleanupQueue = new Queue(CLEANUP_QUEUE, { connection, prefix });
  cleanupQueue.on('error', (err) => log.warn({ err: err.message }, 'cleanup queue error'));

  const episodes = new Worker(
    EPISODES_QUEUE,
    episodeProcessor({
      docker: opts.docker,
      redis: connection,
      prefix,
      log,
      workerId,
      evidence: new EvidenceStore(opts.dataDir),
      results,
      callTimeoutMs: opts.callTimeoutMs,
      outputCapBytes: opts.outputCapBytes,
      async scheduleCleanup(episodeId, containerId) {
        const data: CleanupJob = CleanupJob.parse({ episodeId, containerId });
        await cleanupQueue.add('remove-sandbox', data, { ...cleanupJobOptions, jobId: cleanupJobId(episodeId, containerId) });
      },
    }),
    { connection, prefix, concurrency: opts.concurrency, name: workerId },
  );
  const cleanup = new Worker(CLEANUP_QUEUE, cleanupProcessor(opts.docker), { connection, prefix, concurrency: 4, name: workerId });
  const checkpoints = new Worker(CHECKPOINTS_QUEUE, checkpointProcessor(new CheckpointStore(opts.dataDir)), {
    connection,
    prefix,
    concurrency: 4,
    name: workerId,
  });

  for (const w of [episodes, cleanup, checkpoints]) {
    w.on('error', (err) => log.error({ queue: w.name, err: err.message }, 'worker error'));
  }
  episodes.on('failed', (job: Job | undefined, err: Error) => {
    if (job === undefined) return;
    const final = job.attemptsMade >= (job.opts.attempts ?? episodeJobOptions.attempts) || err.name === 'UnrecoverableError';
    log.warn({ jobId: job.id, attemptsMade: job.attemptsMade, final, err: err.message }, 'episode attempt failed');
    if (!final) return;
    // The processor records every outcome it sees; this covers what it never saw (a job that stalled
    // too often, a crash outside the processor), so the episode still ends with a result.
    const parsed = EpisodeJob.safeParse(job.data);
    const base = invalidPayloadResult(job, err.message, workerId);
    const result = parsed.success
      ? { ...base, taskId: parsed.data.task.id, provenance: { taskDigest: parsed.data.taskDigest, image: parsed.data.task.image, agent: parsed.data.agent },
          error: { kind: 'infra' as const, code: 'worker_lost', message: err.message } }
      : base;
    results.record(result).catch((e: unknown) => log.error({ jobId: job.id, err: String(e) }, 'recording a failed episode failed'));
  });
  log.info({ workerId, concurrency: opts.concurrency }, 'worker started');

  return {
    workerId,
    async close() {
      await Promise.all([episodes.close(), cleanup.close(), checkpoints.close()]);
      await cleanupQueue.close();
      await connection.quit().catch(() => connection.disconnect());
      log.info({ workerId }, 'worker stopped');
    },
  };
}
