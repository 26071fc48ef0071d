// The warm sandbox pool of one worker: containers created and started ahead, hardened as any sandbox
// (network none, no capabilities, the task's limits), labelled as this worker's pooled sandboxes, so
// an episode's set-up claims a running one instead of waiting for create and start. Kept per kind (image,
// workdir, limits, the runtime generation mounted, and for a Harbor task's built or docker_image image
// its ENTRYPOINT's keep-alive, environment, exec user and the files written before the start, /logs):
// a claim takes one of its kind, or none (the
// caller creates its own, as without a pool), and the kind is refilled in the background (after a
// claim, once the claimer's set-up is done with the engine: the refill's create and start would slow
// its workspace copy by a third here). A claimed
// sandbox is the episode's alone and is never returned: close removes it as any other.
//
// Each pooled sandbox gets its own empty folder bind-mounted read-only at the same path, created with
// it: the claiming episode's model proxy puts its socket there (a bind mount cannot be added later).
// Which episode claimed a sandbox is written to Redis before the sandbox is handed over (its labels,
// fixed at creation, name no episode), so the reaper can salvage and remove it like any other. A
// runtime generation change drops the kinds that mount the old one; kinds unclaimed for `idleMs` and
// the least recently claimed beyond `maxKinds` are dropped too; drain() removes everything.
//
// A kind may be one task's: its sandboxes hold the task's workspace, written before the start (the
// kind's key covers those bytes), so a GRPO group's samples go straight to the agent. The claimer says
// whether more of the task are coming (src/worker/upcoming-tasks.ts): while they are, the seeded kind
// is made and filled; the claim that says none more drops what is left of it (and the episode warms
// the kind for any task in its place, prefill); a seeded kind unclaimed for SEEDED_IDLE_MS goes too.
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, rm } from 'node:fs/promises';
import path from 'node:path';
import type Docker from 'dockerode';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { untilAborted } from '../deadlines/deadline.ts';
import { sandboxClaimKey } from '../redis/redis-keys.ts';
import type { SandboxOwner } from './labels.ts';
import { SandboxSession, removeContainer, type SessionSpec } from './sandbox-session.ts';
import type { SandboxRuntime } from './sandbox-runtime.ts';

/** What a pooled sandbox is made for; a claim matches all of it. */
export type PoolSpec = Pick<SessionSpec, 'image' | 'workdir' | 'limits' | 'mounts' | 'harbor' | 'filesInImage' | 'filesBeforeStart'>;

export interface PoolOptions {
  docker: Docker;
  log: Logger;
  callTimeoutMs: number;
  redis: Redis;
  prefix: string;
  workerId: string;
  /** Warm sandboxes kept ready per kind. 0: no pool. */
  size: number;
  /** Where each pooled sandbox's own folder is made (the data folder's run/). */
  runDir: string;
  /** The engine's runtime its sandboxes run under (FLEET_SANDBOX_RUNTIME). @default the engine's default */
  runtime?: SandboxRuntime | undefined;
  /** Kinds kept warm at once; the least recently claimed is dropped first. @default 4 */
  maxKinds?: number;
  /** A kind not claimed for this long is dropped. @default 10 minutes */
  idleMs?: number;
}

export interface Claimed {
  /** The sandbox, now the episode's. */
  session: SandboxSession;
  /** Its own folder, bind-mounted at the same path: the model proxy's socket goes here. */
  folder: string;
  /**
   * Start refilling the kind: the claimer calls it once its set-up's engine calls are done (or failed),
   * so the refill's create and start do not slow them. Once only; later calls do nothing.
   */
  refill: () => void;
}

interface Warm {
  session: SandboxSession;
  folder: string;
}

/** Whether more episodes of a task wait in the queue besides `episodeId` (src/worker/upcoming-tasks.ts). */
export interface TaskLookahead {
  moreOf(taskDigest: string, episodeId: string): Promise<boolean>;
}

/** How a claim treats its kind. */
export interface ClaimHow {
  /**
   * Make the kind when it is new, and fill it after the claim (at once on a miss, else when the
   * claimer calls refill). False: take a ready one if there is one, make nothing. @default true
   */
  fill?: boolean;
  /**
   * The kind is one task's (its workspace written before the start): dropped once unclaimed for
   * SEEDED_IDLE_MS, or at once by a claim that says none more of its task is coming (`fill` false).
   */
  seeded?: boolean;
}

/** A kind seeded with one task's workspace and unclaimed this long is dropped: its task's group is over. */
export const SEEDED_IDLE_MS = 30_000;

interface Kind {
  key: string;
  spec: PoolSpec;
  /** Unclaimed this long, the kind is dropped. */
  idleMs: number;
  ready: Warm[];
  filling: number;
  lastClaimed: number;
  /** After a failed creation, no refill before this time (an engine that refuses is not hammered). */
  retryAt: number;
}

/** A claim record outlives any episode (deadlines are at most 7 days); the sandbox's removal deletes it. */
const CLAIM_TTL_MS = 8 * 24 * 3600 * 1000;
const RETRY_AFTER_FAILURE_MS = 5_000;

/** The identity of a kind: everything the container was created with that an episode depends on. */
export function poolKey(spec: PoolSpec): string {
  const { memoryMb, cpus, pids, diskMb } = spec.limits;
  const { harbor } = spec;
  // A Harbor sandbox's process, environment and exec user are part of it: its ENTRYPOINT sees the env,
  // and the adopted session runs every command as the user it was created for.
  const harborPart = harbor === undefined
    ? null
    : [[...harbor.keepAlive], Object.entries(harbor.env).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)), harbor.user ?? null];
  const files = (tar: Buffer | undefined) => (tar === undefined ? null : createHash('sha256').update(tar).digest('hex'));
  return JSON.stringify([spec.image, spec.workdir, memoryMb, cpus, pids, diskMb ?? null, (spec.mounts ?? []).map((m) => [m.volumeName, m.target]), harborPart, files(spec.filesInImage), files(spec.filesBeforeStart)]);
}

const mountsOf = (spec: PoolSpec) => JSON.stringify((spec.mounts ?? []).map((m) => [m.volumeName, m.target]));

export class SandboxPool {
  private readonly kinds = new Map<string, Kind>();
  private readonly creating = new Set<Promise<void>>();
  private closed = false;
  private readonly sweep: NodeJS.Timeout;
  private readonly idleMs: number;

  constructor(private readonly opts: PoolOptions) {
    const idleMs = opts.idleMs ?? 10 * 60_000;
    this.idleMs = idleMs;
    this.sweep = setInterval(() => {
      for (const kind of this.kinds.values()) if (Date.now() - kind.lastClaimed > kind.idleMs) this.drop(kind, 'idle');
    }, Math.min(idleMs, SEEDED_IDLE_MS, 60_000) / 2);
    this.sweep.unref();
  }

  get enabled(): boolean {
    return this.opts.size > 0 && !this.closed;
  }

  /** Warm sandboxes ready now, over all kinds (a metric, and the tests'). */
  get readyCount(): number {
    let n = 0;
    for (const kind of this.kinds.values()) n += kind.ready.length;
    return n;
  }

  /** Warm sandboxes ready or being made, over all kinds. */
  get warmingCount(): number {
    let n = 0;
    for (const kind of this.kinds.values()) n += kind.ready.length + kind.filling;
    return n;
  }

  /**
   * A warm sandbox of `spec`'s kind, now `owner`'s, or undefined when none is ready (the caller creates
   * its own). The kind is refilled in the background (unless `how.fill` is false): on a miss at once,
   * or once `missRefillAfter` settles (the claimer's set-up is done with the engine).
   */
  async claim(spec: PoolSpec, owner: SandboxOwner, signal: AbortSignal, missRefillAfter?: Promise<unknown>, how: ClaimHow = {}): Promise<Claimed | undefined> {
    if (!this.enabled) return undefined;
    const fill = how.fill ?? true;
    // One runtime generation at a time: sandboxes mounting another are of no use any more.
    for (const kind of this.kinds.values()) if (mountsOf(kind.spec) !== mountsOf(spec)) this.drop(kind, 'runtime generation changed');
    const key = poolKey(spec);
    let kind = this.kinds.get(key);
    if (kind === undefined) {
      if (!fill) return undefined;
      kind = this.newKind(key, spec, how.seeded ? Math.min(SEEDED_IDLE_MS, this.idleMs) : this.idleMs);
    }
    const warm = kind.ready.shift();
    if (warm !== undefined || fill) kind.lastClaimed = Date.now();
    // None of its task is coming any more: the rest of a seeded kind (ready or being made) goes now.
    if (!fill && how.seeded) this.drop(kind, 'no more of its task waiting');
    // A miss refills now or once the claimer's set-up is done (it creates its own meanwhile); a hit, when the claimer says.
    if (warm === undefined) {
      if (!fill) return undefined;
      const missed = kind;
      if (missRefillAfter === undefined) this.fill(missed);
      else void missRefillAfter.finally(() => this.fill(missed)).catch(() => undefined);
      return undefined;
    }
    let refilled = !fill;
    const refill = () => {
      if (refilled) return;
      refilled = true;
      this.fill(kind);
    };
    try {
      // Recorded before the sandbox is used: from here on, the reaper knows whose it is.
      const record = JSON.stringify({ episodeId: owner.episodeId, batchId: owner.batchId, attempt: owner.attempt });
      await untilAborted(this.opts.redis.set(sandboxClaimKey(this.opts.prefix, warm.session.containerId), record, 'PX', CLAIM_TTL_MS), signal);
    } catch (err) {
      // Not handed over: nobody else will ever claim it.
      void this.discard(warm);
      refill();
      throw err;
    }
    this.opts.log.debug({ containerId: warm.session.containerId, episodeId: owner.episodeId }, 'warm sandbox claimed');
    return { session: warm.session.adopt(owner), folder: warm.folder, refill };
  }

  /**
   * Keep `spec`'s kind warm without claiming from it: made when new, filled once `after` settles. A
   * claim from a seeded kind whose task is done gives its place back to the kind for any task.
   */
  prefill(spec: PoolSpec, after: Promise<unknown>): void {
    if (!this.enabled) return;
    const key = poolKey(spec);
    const kind = this.kinds.get(key) ?? this.newKind(key, spec, this.idleMs);
    void after.finally(() => this.fill(kind)).catch(() => undefined);
  }

  /** A kind made now; beyond maxKinds, the least recently claimed other one is dropped. */
  private newKind(key: string, spec: PoolSpec, idleMs: number): Kind {
    const kind: Kind = { key, spec, idleMs, ready: [], filling: 0, lastClaimed: Date.now(), retryAt: 0 };
    this.kinds.set(key, kind);
    const maxKinds = this.opts.maxKinds ?? 4;
    if (this.kinds.size > maxKinds) {
      const oldest = [...this.kinds.values()].filter((k) => k !== kind).sort((a, b) => a.lastClaimed - b.lastClaimed)[0];
      if (oldest) this.drop(oldest, 'too many kinds');
    }
    return kind;
  }

  private fill(kind: Kind): void {
    while (this.enabled && this.kinds.get(kind.key) === kind && Date.now() >= kind.retryAt && kind.ready.length + kind.filling < this.opts.size) {
      kind.filling++;
      const made: Promise<void> = this.create(kind.spec)
        .then((warm) => {
          // Dropped or drained meanwhile: not wanted any more.
          if (this.kinds.get(kind.key) !== kind || this.closed) return this.discard(warm);
          kind.ready.push(warm);
          return undefined;
        }, (err: unknown) => {
          kind.retryAt = Date.now() + RETRY_AFTER_FAILURE_MS;
          this.opts.log.warn({ image: kind.spec.image, err: String(err) }, 'warm sandbox not created; episodes create their own meanwhile');
        })
        .finally(() => {
          kind.filling--;
          this.creating.delete(made);
        });
      this.creating.add(made);
    }
  }

  private async create(spec: PoolSpec): Promise<Warm> {
    const { opts } = this;
    const folder = path.join(opts.runDir, `pool-${randomBytes(8).toString('hex')}`);
    await mkdir(folder, { recursive: true, mode: 0o755 });
    let containerId: string | undefined;
    try {
      const session = await SandboxSession.open(
        { docker: opts.docker, log: opts.log, callTimeoutMs: opts.callTimeoutMs },
        { ...spec, owner: { fleet: opts.prefix, workerId: opts.workerId, episodeId: '', batchId: '', attempt: 0 }, pooled: true, bindFolders: [folder], runtime: opts.runtime },
        (id) => (containerId = id),
        AbortSignal.timeout(opts.callTimeoutMs * 3),
      );
      return { session, folder };
    } catch (err) {
      if (containerId !== undefined) await removeContainer(opts.docker, containerId, opts.callTimeoutMs).catch(() => undefined);
      await rm(folder, { recursive: true, force: true });
      throw err;
    }
  }

  private drop(kind: Kind, why: string): void {
    this.kinds.delete(kind.key);
    const ready = kind.ready.splice(0);
    if (ready.length > 0) this.opts.log.debug({ image: kind.spec.image, count: ready.length, why }, 'warm sandboxes dropped');
    for (const warm of ready) void this.discard(warm);
  }

  private async discard(warm: Warm): Promise<void> {
    warm.session.stopWatching();
    await removeContainer(this.opts.docker, warm.session.containerId, this.opts.callTimeoutMs)
      .catch((err: unknown) => this.opts.log.warn({ containerId: warm.session.containerId, err: String(err) }, 'warm sandbox not removed; the reaper removes it once this worker is gone'));
    await rm(warm.folder, { recursive: true, force: true });
  }

  /** Remove every warm sandbox, those being created included; no more are made. */
  async drain(): Promise<void> {
    this.closed = true;
    clearInterval(this.sweep);
    await Promise.allSettled([...this.creating]);
    const all = [...this.kinds.values()];
    this.kinds.clear();
    await Promise.allSettled(all.flatMap((kind) => kind.ready.splice(0).map((warm) => this.discard(warm))));
  }
}
