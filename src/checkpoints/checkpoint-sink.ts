// The worker's side of the checkpoint pipeline. The episode runner offers every checkpoint and goes on:
// offer() returns at once, never waiting for Redis or disk. Per episode, one hand-off runs at a time
// and at most one offer waits in memory (a newer one replaces it: latest wins). A hand-off reads the
// workspace tar (capped while streaming), stages the checkpoint in a Redis hash with a TTL, adds a
// small job to the `checkpoints` queue, and then removes this episode's older jobs that still wait
// (and their stages): a job being written stays. So an episode holds at most about two checkpoints in
// Redis however far the writer falls behind, and the newest one is always written.
import type { Readable } from 'node:stream';
import type { Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { CHECKPOINT_JOB, checkpointJobId, checkpointJobOptions, type CheckpointJob } from './checkpoint-job.ts';
import { describeIssues } from '../config/zod-issues.ts';
import { captureWorkspace } from './capture-workspace.ts';
import { CheckpointOffer, type Checkpoint } from './checkpoint.ts';
import { newStagedKey, stageCheckpoint } from './checkpoint-staging.ts';
import { untilAborted } from '../deadlines/deadline.ts';

export interface CheckpointSinkOptions {
  /** The fleet's Redis (workers: `maxRetriesPerRequest: null`); shared, the caller closes it after the sink. */
  connection: Redis;
  /** The `checkpoints` queue on that connection; the caller closes it after the sink. */
  queue: Queue;
  prefix: string;
  log: Logger;
  /** A workspace tar larger than this is not captured; the checkpoint says so. @default 8388608 (8 MiB) */
  workspaceCapBytes?: number;
  /** Reading one workspace tar may take this long; then it is not captured. @default 60000 */
  workspaceReadTimeoutMs?: number;
  /** A staged checkpoint no writer took expires after this long. @default 86400000 (24 h) */
  stagedTtlMs?: number;
}

export interface CheckpointSinkStats {
  offered: number;
  /** Replaced in memory by a newer offer of the same episode before reaching Redis. */
  replaced: number;
  /** Staged and enqueued. */
  handedOver: number;
  /** Removed from Redis while still waiting, because a newer one of the same episode was handed over. */
  superseded: number;
  /** Hand-offs that failed (logged); that checkpoint is not in Redis. */
  failed: number;
}

interface PendingOffer {
  offer: CheckpointOffer;
  tar?: Readable;
  offeredAt: number;
}

interface QueuedCheckpoint {
  jobId: string;
  seq: number;
  stagedKey: string;
}

interface Lane {
  pending?: PendingOffer;
  running?: Promise<void>;
  /** Jobs this sink added for the episode that may still wait. */
  queued: QueuedCheckpoint[];
  /** Seq of the last checkpoint handed over. */
  lastSeq?: number;
}

const REMOVABLE = new Set(['waiting', 'delayed', 'prioritized', 'waiting-children']);

function checkedPositive(name: string, value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isInteger(value) || value < 1) throw new TypeError(`Expected \`${name}\` to be an integer from 1 up, got \`${value}\` (${typeof value})`);
  return value;
}

export class CheckpointSink {
  readonly stats: CheckpointSinkStats = { offered: 0, replaced: 0, handedOver: 0, superseded: 0, failed: 0 };
  private readonly lanes = new Map<string, Lane>();
  private readonly queue: Queue;
  private readonly redis: Redis;
  private readonly prefix: string;
  private readonly log: Logger;
  private readonly capBytes: number;
  private readonly readTimeoutMs: number;
  private readonly ttlMs: number;
  private closed = false;

  constructor(opts: CheckpointSinkOptions) {
    this.redis = opts.connection;
    this.prefix = opts.prefix;
    this.log = opts.log;
    this.capBytes = checkedPositive('workspaceCapBytes', opts.workspaceCapBytes, 8 * 1024 * 1024);
    this.readTimeoutMs = checkedPositive('workspaceReadTimeoutMs', opts.workspaceReadTimeoutMs, 60_000);
    this.ttlMs = checkedPositive('stagedTtlMs', opts.stagedTtlMs, 24 * 3600 * 1000);
    this.queue = opts.queue;
  }

  /**
   * Hand a checkpoint to the writer; returns at once. `workspaceTar` (what `getArchive(workdir)`
   * returned) is read later, by the hand-off; a replaced offer's stream is destroyed unread. Of the
   * offers waiting for the episode's hand-off, the one with the highest seq (the latest on a tie) wins.
   * Throws a TypeError for an invalid checkpoint, an Error once the sink is closed.
   */
  offer(checkpoint: CheckpointOffer, workspaceTar: Readable | undefined): void {
    if (this.closed) {
      workspaceTar?.destroy();
      throw new Error('checkpoint sink is closed');
    }
    const parsed = CheckpointOffer.safeParse(checkpoint);
    if (!parsed.success) {
      workspaceTar?.destroy();
      throw new TypeError(`invalid checkpoint: ${describeIssues(parsed.error, checkpoint).join('; ')}`);
    }
    this.stats.offered += 1;
    const { episodeId } = parsed.data;
    let lane = this.lanes.get(episodeId);
    if (lane === undefined) {
      lane = { queued: [] };
      this.lanes.set(episodeId, lane);
    }
    if (lane.pending && lane.pending.offer.seq > parsed.data.seq) {
      // Offers can arrive out of order (each waited for its own getArchive): the newer one stays.
      workspaceTar?.destroy();
      this.stats.replaced += 1;
      return;
    }
    if (lane.pending) {
      lane.pending.tar?.destroy();
      this.stats.replaced += 1;
    }
    lane.pending = { offer: parsed.data, ...(workspaceTar && { tar: workspaceTar }), offeredAt: Date.now() };
    if (lane.running === undefined) lane.running = this.pump(lane);
  }

  /**
   * Resolves once everything offered for the episode so far is in Redis (or failed, logged), with the
   * seq last handed over. Call it at the episode's close: the sink then forgets the episode. Rejects
   * with the signal's reason when `signal` aborts first (the hand-offs go on).
   */
  async flush(episodeId: string, signal?: AbortSignal): Promise<number | undefined> {
    const lane = this.lanes.get(episodeId);
    if (lane === undefined) return undefined;
    while (lane.running !== undefined) await untilAborted(lane.running, signal);
    if (this.lanes.get(episodeId) === lane) this.lanes.delete(episodeId);
    return lane.lastSeq;
  }

  /** No more offers; resolves once every offer made is handed over (or failed). */
  async close(signal?: AbortSignal): Promise<void> {
    this.closed = true;
    await Promise.all([...this.lanes.keys()].map((id) => this.flush(id, signal)));
  }

  private async jobStagedKey(jobId: string): Promise<string | undefined> {
    const data = await this.redis.hget(this.queue.toKey(jobId), 'data');
    return data === null ? undefined : (JSON.parse(data) as { stagedKey?: string }).stagedKey;
  }

  private async pump(lane: Lane): Promise<void> {
    // Start on a later turn of the event loop: offer() itself does no reading, hashing or I/O.
    await new Promise((r) => setImmediate(r));
    for (let next = lane.pending; next !== undefined; next = lane.pending) {
      lane.pending = undefined;
      try {
        await this.handOver(lane, next);
      } catch (err) {
        this.stats.failed += 1;
        this.log.warn({ episodeId: next.offer.episodeId, seq: next.offer.seq, err: (err as Error).message }, 'checkpoint hand-off failed');
      }
    }
    lane.running = undefined;
  }

  private async handOver(lane: Lane, { offer, tar, offeredAt }: PendingOffer): Promise<void> {
    const { workspace, data } = await captureWorkspace(tar, this.capBytes, this.readTimeoutMs);
    const checkpoint: Checkpoint = { ...offer, createdAt: offer.createdAt ?? new Date(offeredAt).toISOString(), workspace };
    const { episodeId, seq } = checkpoint;
    const jobId = checkpointJobId(episodeId, seq);
    const stagedKey = newStagedKey(this.prefix, jobId);
    const payload: CheckpointJob = { episodeId, seq, stagedKey, createdAt: checkpoint.createdAt };
    // Stage and enqueue without waiting in between: one connection, so Redis applies the stage first
    // and a writer never finds the job before its stage; both usually share one AOF fsync.
    const [staged, added] = await Promise.allSettled([
      stageCheckpoint(this.redis, stagedKey, checkpoint, data, this.ttlMs),
      this.queue.add(CHECKPOINT_JOB, payload, { ...checkpointJobOptions, jobId }),
    ]);
    // The same seq may have been handed over before: then the job that was there keeps its own stage.
    // Unknown (Redis failed us just now): leave the stage to its TTL rather than risk the job's.
    const owner = added.status === 'fulfilled' ? await this.jobStagedKey(jobId).catch(() => 'unknown') : undefined;
    const ours = owner === stagedKey;
    if (staged.status === 'rejected' || added.status === 'rejected') {
      if (ours) await this.queue.remove(jobId).catch(() => undefined);
      await this.redis.del(stagedKey).catch(() => undefined);
      throw staged.status === 'rejected' ? staged.reason : (added as PromiseRejectedResult).reason;
    }
    if (!ours && owner !== 'unknown') await this.redis.del(stagedKey);
    this.stats.handedOver += 1;
    lane.lastSeq = seq;

    // Only now, with the newer one safely in Redis, drop older ones no writer has started.
    const keep: QueuedCheckpoint[] = [];
    for (const older of lane.queued) {
      if (older.seq >= seq || older.jobId === jobId) {
        keep.push(older);
        continue;
      }
      try {
        const state = await this.queue.getJobState(older.jobId);
        if (state === 'active') keep.push(older);
        if (!REMOVABLE.has(state)) continue;
        // remove() refuses (0) a job a writer has locked meanwhile: that one is being written, it stays.
        if ((await this.queue.remove(older.jobId)) === 1) {
          await this.redis.del(older.stagedKey);
          this.stats.superseded += 1;
        } else {
          keep.push(older);
        }
      } catch (err) {
        // The hand-off itself succeeded; the older one is simply written too.
        this.log.warn({ episodeId, seq: older.seq, err: (err as Error).message }, 'superseded checkpoint not removed');
        keep.push(older);
      }
    }
    if (ours) keep.push({ jobId, seq, stagedKey });
    lane.queued = keep;
  }
}
