// The typed client a trainer uses from TypeScript: enqueue a batch (a batch file, or a batch object
// naming task folders), follow its results as they finish (an async iterator over the batch's
// completion stream in Redis: completion order, resumable from a cursor, never the same entry twice,
// across Redis reconnects and restarts), with a group event once every sample of a task has ended;
// status, cancel, retry by kind. Exported by the package as `rollout-fleet/client`.
import { randomBytes } from 'node:crypto';
import os from 'node:os';
import type { Readable } from 'node:stream';
import { setTimeout as delay } from 'node:timers/promises';
import type { Redis } from 'ioredis';
import { EPISODES_QUEUE, type EpisodeResult } from '../episode/episode-job.ts';
import { connectRedis } from './connect-redis.ts';
import { shownValue } from '../config/zod-issues.ts';
import { EpisodeControl } from '../episode/episode-control.ts';
import type { FailureKind } from '../errors/failure-kind.ts';
import { cancelEpisode, type CancelOutcome } from '../producer/cancel-episodes.ts';
import { enqueueBatch, type EnqueuedBatch } from '../producer/enqueue-batch.ts';
import { retryByKind, type RetryReport } from '../producer/retry-by-kind.ts';
import type { BatchSummary } from '../results/batch-summary.ts';
import { ResultsStore } from '../results/results-store.ts';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { EPISODE_ID_PATTERN } from '../ids/episode-id.ts';
import type { TrajectoryRecord } from '../results/trajectory-export.ts';
import type { BatchFile } from '../tasks/batch-spec.ts';
import { loadBatch, loadBatchObject, type LoadedBatch } from '../tasks/load-task.ts';
import { storeTaskFolder, storeUploadedTask, type StoredTask } from '../tasks/task-upload.ts';
import { getPolicyVersion, setPolicyVersion, type PolicyVersionState, type PolicyVersionsSeen } from '../model/policy-versions.ts';

export type { EpisodeResult } from '../episode/episode-job.ts';
export type { BatchSummary } from '../results/batch-summary.ts';
export type { TrajectoryRecord } from '../results/trajectory-export.ts';
export type { StoredTask } from '../tasks/task-upload.ts';
export type { PolicyVersionState, PolicyVersionsSeen } from '../model/policy-versions.ts';
export { PolicyVersionConflict } from '../model/policy-versions.ts';

export interface FleetClientOptions {
  redisUrl: string;
  /** The fleet's key prefix (FLEET_PREFIX). @default 'rf' */
  prefix?: string;
  /** The fleet's data folder (FLEET_DATA_DIR): evidence is read there unless `artifacts` says otherwise. @default the temp folder */
  dataDir?: string;
  /** Where evidence and trajectories are kept (FLEET_ARTIFACTS: s3://bucket/prefix or a folder). @default dataDir */
  artifacts?: string;
  /** Checks an image before enqueueing; unset, images are not checked here (workers refuse unknown ones). */
  imageExists?: (image: string) => Promise<boolean | undefined>;
}

/** What the results iterator yields. */
export type BatchEvent =
  | { kind: 'result'; cursor: string; result: EpisodeResult }
  /**
   * Every sample of `taskId` in the batch has ended (sent once per task, after its last result). Its
   * cursor is the last result's with `:g`: resuming from it does not send the group again; resuming
   * from the result's own cursor does. `rewards` and `metrics` are in the order of `episodeIds` (null:
   * not graded; metrics null also for exit-code grading). `policyVersions` are the versions the
   * group's episodes saw (the lowest first, the highest last, every one seen), absent when none was set.
   */
  | {
    kind: 'group'; cursor: string; taskId: string; episodeIds: string[]; rewards: (number | null)[]; metrics: (Record<string, number> | null)[];
    policyVersions?: PolicyVersionsSeen; results: EpisodeResult[];
  };

/**
 * A batch as an object: each task a folder (relative to the working folder) or a stored task
 * (`{ digest }` from `uploadTask`); the rest as in a batch file.
 */
export type BatchSpec = Omit<BatchFile, 'samples' | 'defaults'> & Partial<Pick<BatchFile, 'samples' | 'defaults'>> & { name: string };

/** A batch as the listing shows it. */
export interface BatchListing {
  batchId: string;
  name: string;
  createdAt: string;
  total: number;
  done: number;
  finished: boolean;
}

/** One evidence file of an episode's attempt. */
export interface EvidenceEntry {
  attempt: number;
  name: string;
  bytes: number;
}

const taskOf = (episodeId: string, batchId: string) => episodeId.slice(batchId.length + 1).replace(/\.\d+$/, '');

/** The fleet's Redis could not be reached when the client connected. */
export class FleetConnectionError extends Error {
  override readonly name = 'FleetConnectionError';
}

export class FleetClient {
  private constructor(
    private readonly redis: Redis,
    private readonly prefix: string,
    private readonly store: ResultsStore,
    private readonly dataDir: string,
    private readonly opts: FleetClientOptions,
  ) {}

  /** The connections of the result iterators now open (closed with the client). */
  private readonly readers = new Set<Redis>();

  // BullMQ, the S3 client and the trajectory reader load on first use: `status` in a loop needs none.
  private artifactStore: Promise<ArtifactStore> | undefined;
  private artifacts(): Promise<ArtifactStore> {
    this.artifactStore ??= import('../artifacts/open-store.ts').then(({ openArtifactStore }) => openArtifactStore(this.opts.artifacts, this.dataDir));
    return this.artifactStore;
  }

  private async queue(): Promise<import('bullmq').Queue> {
    const { Queue } = await import('bullmq');
    const queue = new Queue(EPISODES_QUEUE, { connection: this.redis, prefix: this.prefix });
    queue.on('error', () => undefined);
    return queue;
  }

  /**
   * Connect to the fleet's Redis. A Redis that cannot be reached now fails here, at once, with a
   * FleetConnectionError (the URL's password masked); once connected, the client waits out outages.
   */
  static async connect(opts: FleetClientOptions): Promise<FleetClient> {
    const prefix = opts.prefix ?? 'rf';
    // Connection errors are retried by ioredis (and by the iterator); they are not the caller's.
    const redis = await connectRedis(opts.redisUrl, { maxRetriesPerRequest: null, connectionName: 'rf-client' }, FleetConnectionError);
    const dataDir = opts.dataDir ?? os.tmpdir();
    return new FleetClient(redis, prefix, new ResultsStore(redis, prefix, dataDir), dataDir, opts);
  }

  /** Whether the client's Redis connection is up now (a service answers 503 instead of waiting when not). */
  get connected(): boolean {
    return this.redis.status === 'ready';
  }

  /** Check, pack and store a task folder; batches name it by the digest returned. */
  async uploadTask(dir: string): Promise<StoredTask> {
    return storeTaskFolder(dir, { redis: this.redis, prefix: this.prefix });
  }

  /** The same for a task sent as a tar of its folder's contents (the API's upload), read as hostile. */
  async uploadTaskTar(tar: Buffer): Promise<StoredTask> {
    return storeUploadedTask(tar, { redis: this.redis, prefix: this.prefix });
  }

  /**
   * Enqueue a batch file, or a batch object. Idempotent: the same batch names the same batch id and is
   * not added twice (`added: false`). Nothing is enqueued from a batch with any problem.
   */
  async enqueue(batch: string | BatchSpec): Promise<EnqueuedBatch> {
    const archives = { redis: this.redis, prefix: this.prefix };
    return this.enqueueLoaded(typeof batch === 'string'
      ? await loadBatch(batch, archives)
      : await loadBatchObject(batch, { file: 'batch', base: process.cwd(), archives }));
  }

  /**
   * Enqueue a batch object from someone else (the API's request body): stored tasks only, never a
   * folder of this machine; messages name the fields as `request: <field>: ...`.
   */
  async enqueueRequest(body: unknown): Promise<EnqueuedBatch> {
    return this.enqueueLoaded(await loadBatchObject(body, { file: 'request', archives: { redis: this.redis, prefix: this.prefix } }));
  }

  private async enqueueLoaded(loaded: LoadedBatch): Promise<EnqueuedBatch> {
    const { FlowProducer } = await import('bullmq');
    const flows = new FlowProducer({ connection: this.redis, prefix: this.prefix });
    flows.on('error', () => undefined);
    try {
      return await enqueueBatch(loaded, {
        flows, redis: this.redis, prefix: this.prefix, results: this.store,
        imageExists: this.opts.imageExists ?? (async () => undefined),
      });
    } finally {
      await flows.close();
    }
  }

  /** Every result of the batch recorded so far (undefined for an unknown batch). */
  async resultsSoFar(batchId: string): Promise<EpisodeResult[] | undefined> {
    if ((await this.store.getManifest(batchId)) === undefined) return undefined;
    return this.store.results(batchId);
  }

  /**
   * Every result of the batch recorded so far, in the manifest's order, a page at a time (a reader of
   * 100,000 results holds one page, not all); undefined for an unknown batch.
   */
  async resultPages(batchId: string, pageSize?: number): Promise<AsyncGenerator<EpisodeResult[]> | undefined> {
    const manifest = await this.store.getManifest(batchId);
    return manifest === undefined ? undefined : this.store.resultPages(batchId, manifest, pageSize);
  }

  /** The trajectory document of each result, read one at a time from the artifact store. */
  async *trajectories(results: readonly EpisodeResult[], signal: AbortSignal): AsyncGenerator<TrajectoryRecord> {
    const { trajectoryRecords } = await import('../results/trajectory-export.ts');
    yield* trajectoryRecords(results, await this.artifacts(), signal);
  }

  /** One episode's result, or undefined while it has none. */
  async result(batchId: string, episodeId: string): Promise<EpisodeResult | undefined> {
    return this.store.get(batchId, episodeId);
  }

  /**
   * The episode's trajectory document (task, status, reward, attempts, the checkpoint it resumed from,
   * usage, timings, and the final attempt's conversation with token ids and logprobs when captured),
   * or undefined while the episode has no result.
   */
  async trajectory(batchId: string, episodeId: string, signal: AbortSignal = AbortSignal.timeout(60_000)): Promise<TrajectoryRecord | undefined> {
    const result = await this.store.get(batchId, episodeId);
    if (result === undefined) return undefined;
    for await (const record of this.trajectories([result], signal)) return record;
    return undefined;
  }

  /** The evidence files each attempt of the episode kept, attempts in order. */
  async evidenceIndex(episodeId: string, signal: AbortSignal = AbortSignal.timeout(60_000)): Promise<EvidenceEntry[]> {
    if (!EPISODE_ID_PATTERN.test(episodeId)) throw new TypeError(`episodeId: not an episode id (got ${JSON.stringify(episodeId.slice(0, 80))})`);
    const base = `evidence/${episodeId}/`;
    const entries: EvidenceEntry[] = [];
    for (const { key, bytes } of await (await this.artifacts()).list(base, { signal })) {
      const match = /^attempt-(\d+)\/([^/]+)$/.exec(key.slice(base.length));
      if (match !== null && !match[2]!.startsWith('.')) entries.push({ attempt: Number(match[1]), name: match[2]!, bytes });
    }
    return entries.sort((a, b) => a.attempt - b.attempt || a.name.localeCompare(b.name));
  }

  /** One evidence file as a stream, or undefined when the attempt kept none of that name. */
  async openEvidence(episodeId: string, attempt: number, name: string, signal: AbortSignal): Promise<Readable | undefined> {
    const entry = (await this.evidenceIndex(episodeId, signal)).find((e) => e.attempt === attempt && e.name === name);
    return entry === undefined ? undefined : (await this.artifacts()).open(`evidence/${episodeId}/attempt-${attempt}/${name}`, { signal });
  }

  /**
   * Whether `cursor` is one this batch's result stream could have sent: '0', or the id of an entry of
   * its completion stream (with `:g` for a group's). A cursor of another batch, or past the end, is not.
   */
  async knowsCursor(batchId: string, cursor: string): Promise<boolean> {
    if (!isCursor(cursor)) return false;
    if (cursor === '0') return true;
    return this.store.hasCompletion(batchId, cursor.replace(/:g$/, ''));
  }

  /**
   * A page of the batches, newest first: at most `limit` after the batch `after` (a previous page's
   * last), each with its name, creation time and progress; `next` is the page token to ask for next
   * (undefined: none). Throws a TypeError naming `after` when it is not a listed batch.
   */
  async listBatches(opts: { limit?: number; after?: string } = {}): Promise<{ batches: BatchListing[]; next?: string }> {
    const page = await this.store.pageBatches(opts.limit ?? 100, opts.after);
    if (page === undefined) throw new TypeError(`after: not a batch of this fleet's listing (got ${shownValue(opts.after ?? '')})`);
    const batches: BatchListing[] = [];
    for (const batchId of page.batchIds) {
      const [manifest, summary] = await Promise.all([this.store.getManifest(batchId), this.store.summary(batchId)]);
      if (manifest === undefined || summary === undefined) continue;
      batches.push({ batchId, name: manifest.name, createdAt: manifest.createdAt, total: summary.total, done: summary.done, finished: summary.finished });
    }
    const last = page.batchIds.at(-1);
    return { batches, ...(page.more && last !== undefined && { next: last }) };
  }

  /** The batch's summary so far, or undefined for an unknown batch. */
  async status(batchId: string): Promise<BatchSummary | undefined> {
    return this.store.summary(batchId);
  }

  /**
   * The batch's results as they finish, in completion order, from after `after` (a cursor a previous
   * event carried; '0' from the start), and a group event once all samples of a task have ended. Ends
   * when every episode has a result and all were delivered; `signal` ends it early. Survives Redis
   * going away (it waits and reads on from its cursor).
   */
  async *results(batchId: string, opts: { after?: string; signal?: AbortSignal; blockMs?: number } = {}): AsyncGenerator<BatchEvent> {
    const from = opts.after ?? '0';
    if (!isCursor(from)) throw new TypeError(`after: not a cursor: expected an event's cursor, or 0 (got ${JSON.stringify(from.slice(0, 80))})`);
    // A group event's cursor (`<entry>:g`): the group of that entry was delivered too.
    const groupAcked = from.endsWith(':g');
    let cursor = groupAcked ? from.slice(0, -2) : from;
    const manifest = await this.retrying(() => this.store.getManifest(batchId), opts.signal);
    if (manifest === undefined) throw new TypeError(`batchId: no batch ${JSON.stringify(batchId)}`);
    if (!(await this.retrying(() => this.knowsCursor(batchId, from), opts.signal))) {
      throw new TypeError(`after: not a cursor of batch ${batchId}'s stream: expected an event's cursor this batch sent, or 0 (got ${shownValue(from)})`);
    }
    // Each task's episodes, in sample order (the manifest's): a group names them and reads only them.
    const episodesOf = new Map<string, string[]>();
    for (const id of manifest.episodeIds) episodesOf.set(taskOf(id, batchId), [...(episodesOf.get(taskOf(id, batchId)) ?? []), id]);
    // Groups already complete before the cursor were announced then: known from what precedes it.
    const startedAt = cursor;
    const before = cursor === '0' ? [] : await this.retrying(() => this.completionsUpTo(batchId, startedAt), opts.signal);
    const ended = new Map<string, Set<string>>();
    const mark = (episodeId: string) => {
      const task = taskOf(episodeId, batchId);
      const set = ended.get(task) ?? new Set<string>();
      set.add(episodeId);
      ended.set(task, set);
      return { task, done: set.size === episodesOf.get(task)?.length };
    };
    const announced = new Set<string>();
    const groupEvent = async (task: string, at: string): Promise<BatchEvent> => {
      announced.add(task);
      const episodeIds = episodesOf.get(task) ?? [];
      const results = (await this.retrying(() => Promise.all(episodeIds.map((id) => this.store.get(batchId, id))), opts.signal)).filter((r) => r !== undefined);
      const policyVersions = groupVersions(results);
      return {
        kind: 'group', cursor: `${at}:g`, taskId: task, episodeIds: results.map((r) => r.episodeId),
        rewards: results.map((r) => r.reward), metrics: results.map((r) => r.metrics ?? null), ...(policyVersions && { policyVersions }), results,
      };
    };
    for (const c of before) {
      const { task, done } = mark(c.episodeId);
      if (!done || announced.has(task)) continue;
      // The group its last result completed, exactly at the cursor, was not acknowledged: sent again.
      if (c.cursor === startedAt && !groupAcked) yield await groupEvent(task, c.cursor);
      else announced.add(task);
    }
    // XREAD BLOCK holds its connection: each iterator reads on its own, or a stream waiting on a quiet
    // batch would hold back every other one (the API serves many). An abort ends the wait at once.
    const reader = this.redis.duplicate({ connectionName: 'rf-client-reader' });
    reader.on('error', () => undefined);
    this.readers.add(reader);
    const hangUp = () => reader.disconnect();
    opts.signal?.addEventListener('abort', hangUp, { once: true });
    try {
      for (;;) {
        opts.signal?.throwIfAborted();
        const batch = await this.retrying(() => this.store.completions(batchId, cursor, { blockMs: opts.blockMs ?? 2_000 }, reader), opts.signal);
        for (const c of batch) {
          cursor = c.cursor;
          const result = await this.retrying(() => this.store.get(batchId, c.episodeId), opts.signal);
          if (result === undefined) continue; // forgotten since (a retry by kind): its next result comes later
          yield { kind: 'result', cursor, result };
          const { task, done } = mark(c.episodeId);
          if (done && !announced.has(task)) yield await groupEvent(task, cursor);
        }
        if ((await this.retrying(() => this.store.resultCount(batchId), opts.signal)) >= manifest.episodeIds.length) {
          // Everything recorded; one more read (not blocking) makes sure nothing came after the last one read.
          const rest = await this.retrying(() => this.store.completions(batchId, cursor), opts.signal);
          if (rest.length === 0) return;
        }
      }
    } finally {
      opts.signal?.removeEventListener('abort', hangUp);
      this.readers.delete(reader);
      reader.disconnect();
    }
  }

  private async completionsUpTo(batchId: string, cursor: string): Promise<{ cursor: string; episodeId: string }[]> {
    const ids: { cursor: string; episodeId: string }[] = [];
    let from = '0';
    for (;;) {
      const page = await this.store.completions(batchId, from, { count: 1_000 });
      for (const c of page) {
        if (compareIds(c.cursor, cursor) > 0) return ids;
        ids.push({ cursor: c.cursor, episodeId: c.episodeId });
      }
      if (page.length === 0) return ids;
      from = page.at(-1)!.cursor;
    }
  }

  /** Run a Redis read until it succeeds (Redis away, restarting), or the signal aborts. */
  private async retrying<T>(read: () => Promise<T>, signal: AbortSignal | undefined): Promise<T> {
    for (let wait = 100; ; wait = Math.min(2_000, wait * 2)) {
      signal?.throwIfAborted();
      try {
        return await read();
      } catch (err) {
        if (signal?.aborted) throw signal.reason;
        // Only a connection problem is waited out: an error Redis replied with would come back every time.
        if (err instanceof TypeError || (err as Error).name === 'ReplyError') throw err;
        await delay(wait + Math.floor(Math.random() * 50), undefined, signal ? { signal } : undefined);
      }
    }
  }

  /**
   * Cancel a batch (every episode, or those named) or one episode: a waiting episode is removed and
   * recorded cancelled, a running one told to stop, one already closing left to finish ('closing').
   * Throws a TypeError naming `target` when it is neither a batch nor an episode in this Redis.
   */
  async cancel(target: string, opts: { episodeIds?: string[]; by?: string } = {}): Promise<{ batchId: string; batch: boolean; outcomes: Record<string, CancelOutcome> }> {
    const manifest = await this.store.getManifest(target);
    const queue = await this.queue();
    try {
      const deps = { queue, results: this.store, control: new EpisodeControl(this.redis, this.prefix), by: opts.by ?? `client-${randomBytes(3).toString('hex')}` };
      const outcomes: Record<string, CancelOutcome> = {};
      for (const id of manifest ? (opts.episodeIds ?? manifest.episodeIds) : [target]) outcomes[id] = await cancelEpisode(deps, id);
      if (manifest === undefined && outcomes[target] === 'unknown') throw new TypeError(`target: no episode or batch ${JSON.stringify(target)} in this Redis`);
      // A batch id has no dot (a name and a hash): an episode id starts with its batch's.
      return { batchId: manifest ? target : target.split('.')[0]!, batch: manifest !== undefined, outcomes };
    } finally {
      await queue.close();
    }
  }

  /** The episode's result once it has one, waiting at most `timeoutMs`; undefined after that. */
  async waitForResult(batchId: string, episodeId: string, timeoutMs: number): Promise<EpisodeResult | undefined> {
    const { waitForResult } = await import('../producer/cancel-episodes.ts');
    return waitForResult(this.store, batchId, episodeId, timeoutMs);
  }

  /** Run again the batch's episodes that failed with `kind`. */
  async retryByKind(batchId: string, kind: FailureKind): Promise<RetryReport> {
    const queue = await this.queue();
    try {
      return await retryByKind({ queue, redis: this.redis, prefix: this.prefix, results: this.store, control: new EpisodeControl(this.redis, this.prefix) }, batchId, kind);
    } finally {
      await queue.close();
    }
  }

  /**
   * Set the current policy version of a model endpoint (`default` until named endpoints exist): every
   * model call that starts after this returns is stamped with it. Versions only move forward: a lower
   * one throws PolicyVersionConflict (the same one again is kept, with its first setAt).
   */
  async setPolicyVersion(endpoint: string, version: number): Promise<PolicyVersionState> {
    return setPolicyVersion(this.redis, this.prefix, endpoint, version);
  }

  /** The endpoint's current policy version, or undefined when none was ever set. */
  async getPolicyVersion(endpoint: string): Promise<PolicyVersionState | undefined> {
    return getPolicyVersion(this.redis, this.prefix, endpoint);
  }

  async close(): Promise<void> {
    for (const reader of this.readers) reader.disconnect();
    await this.redis.quit().catch(() => this.redis.disconnect());
  }
}

/** The versions a group's episodes saw: the lowest first, the highest last, every one; undefined when none was stamped. */
export function groupVersions(results: readonly EpisodeResult[]): PolicyVersionsSeen | undefined {
  const stamped = results.flatMap((r) => (r.policyVersions ? [r.policyVersions] : []));
  if (stamped.length === 0) return undefined;
  return {
    endpoint: stamped[0]!.endpoint,
    first: Math.min(...stamped.map((v) => v.first)),
    last: Math.max(...stamped.map((v) => v.last)),
    seen: [...new Set(stamped.flatMap((v) => v.seen))].sort((a, b) => a - b),
  };
}

/**
 * A cursor an event carried (`<ms>-<seq>`, `:g` for a group's), or '0'. The parts stay within what a
 * stream entry id of this era holds (15 digits): the largest ids Redis takes cannot be read past.
 */
export function isCursor(value: string): boolean {
  return /^(\d{1,15}-\d{1,15}(:g)?|0)$/.test(value);
}

/** Order of two stream entry ids (`<ms>-<seq>`). */
function compareIds(a: string, b: string): number {
  const [am, as] = a.split('-').map(Number) as [number, number];
  const [bm, bs] = b.split('-').map(Number) as [number, number];
  return am - bm || (as ?? 0) - (bs ?? 0);
}
