// Prepare the runtime generation for a sandbox: hash the inputs (off the event loop, memoised while
// the files stay unchanged), then reuse the generation's volume if it is ready, or install it once per
// Docker engine: one install per process (a shared promise) and per fleet (a Redis lock); waiters
// poll until it is ready. A volume left half-installed is discarded and installed again, never used.
import { stat } from 'node:fs/promises';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { FleetError } from '../errors/fleet-error.ts';
import { runtimeLastUsedKey, runtimeLockKey } from '../redis/redis-keys.ts';
import { isLocked, tryLock } from '../redis/token-lock.ts';
import { engineId, type Docker } from '../sandbox/docker-client.ts';
import { inspectVolume } from '../sandbox/volumes.ts';
import type { VolumeMount } from '../sandbox/sandbox-session.ts';
import { DEFAULT_IMAGE } from '../tasks/task-spec.ts';
import { hashRuntimeInputs } from './build-archive.ts';
import { checkRuntimeInputs, RUNTIME_MOUNT_PATH, type RuntimeInputs } from './runtime-inputs.ts';
import type { HashedInputs } from './runtime-manifest.ts';
import { discardVolume, installGeneration, runtimeVolumeName, volumeState, type VolumeDeps } from './runtime-volume.ts';

export interface RuntimeDeps {
  docker: Docker;
  redis: Redis;
  /** The fleet's Redis key prefix: keys live under it and, unless `volumeScope` is set, it is part of the volume name. */
  prefix: string;
  /**
   * Name volumes (and label them) with this instead of the prefix, so fleets on one engine share one
   * volume per generation (FLEET_RUNTIME_SCOPE). Their install locks live in each fleet's own Redis, so
   * sharing is safe only when the volume is installed before they start (the test suite does that) or
   * they share a Redis. Unset: one volume per fleet, installed under that fleet's lock.
   */
  volumeScope?: string;
  log: Logger;
}

export interface PrepareOptions {
  /** Deadline of each Docker call; the archive upload is one call. @default 30000 */
  callTimeoutMs?: number;
  /** Deadline of the whole preparation, waiting for another process's install included. @default 300000 */
  timeoutMs?: number;
  /** Image of the never-started containers that fill and probe volumes (nothing of it runs). @default DEFAULT_IMAGE */
  helperImage?: string;
  /** TTL of the install lock, renewed every third of it while installing. @default 30000 */
  lockTtlMs?: number;
  /** How often a waiter checks whether the installing process is done. @default 100 */
  pollMs?: number;
  /** How long this process trusts a volume it saw ready without asking the engine again (then: one volume inspect). @default 30000 */
  trustReadyMs?: number;
  /** Stops waiting (not an install already streaming, which has its own deadline). */
  signal?: AbortSignal;
}

/** One preparation's record; also what a session needs to mount the runtime. */
export interface RuntimeGeneration {
  /** sha256 of the canonical manifest of the inputs. */
  generationId: string;
  volumeName: string;
  /** Where sandboxes see the runtime: RUNTIME_MOUNT_PATH. */
  mountPath: string;
  /** Pass in SessionSpec.mounts: the volume, read-only at mountPath. */
  mount: VolumeMount;
  /** This preparation copied nothing (the generation was installed, or another caller installed it). */
  warm: boolean;
  prepareMs: number;
  /** Bytes this preparation sent to the engine (archive and ready marker); 0 when warm. */
  bytesCopied: number;
}

/** Redis hash: generation id -> last preparation (ms since the epoch), read by removeStaleGenerations. */

interface Installed {
  warm: boolean;
  bytesCopied: number;
}

// Per-process state. Hashes are memoised by the inputs' stat identity (device, inode, size, mtime and
// ctime in ns): a replaced or rewritten file changes it, so a changed input is always hashed again.
const MEMO_ENTRIES = 8;
const hashMemo = new Map<string, Promise<HashedInputs>>();
/**
 * Per engine client: volumes this process saw ready (when it last checked, and the volume's creation
 * time then), and installs in flight. A ready volume never loses its files, so the same volume (same
 * creation time) is still ready: re-checking costs one volume inspect, no probe container.
 */
interface SeenReady {
  checkedAt: number;
  createdAt: string;
}
let trustedReady = new WeakMap<Docker, Map<string, SeenReady>>();
const inflight = new WeakMap<Docker, Map<string, Promise<Installed>>>();

function perEngine<V>(store: WeakMap<Docker, Map<string, V>>, docker: Docker): Map<string, V> {
  let map = store.get(docker);
  if (!map) store.set(docker, (map = new Map()));
  return map;
}

/** Forget hashes and volumes seen ready, as a new process would (tests and benchmarks of cold starts). */
export function forgetRuntimeCaches(): void {
  hashMemo.clear();
  trustedReady = new WeakMap();
}

/** Forget that this process saw a volume ready (it is being removed). */
export function distrustVolume(docker: Docker, volumeName: string): void {
  perEngine(trustedReady, docker).delete(volumeName);
}

async function statIdentity(inputs: RuntimeInputs): Promise<string> {
  const parts = await Promise.all(
    inputs.map(async (input) => {
      if ('content' in input) return `${input.path}|${input.mode}|content|${input.content}`;
      const st = await stat(input.source, { bigint: true }).catch((err: unknown) => {
        throw new FleetError('runtime_unavailable', `runtime input ${input.path} (${input.source}): ${(err as Error).message}`, { cause: err });
      });
      return `${input.path}|${input.mode}|${input.source}|${st.dev}|${st.ino}|${st.size}|${st.mtimeNs}|${st.ctimeNs}`;
    }),
  );
  return parts.join('\n');
}

async function hashed(inputs: RuntimeInputs): Promise<HashedInputs> {
  const identity = await statIdentity(inputs);
  let promise = hashMemo.get(identity);
  if (!promise) {
    promise = hashRuntimeInputs(inputs);
    promise.catch(() => hashMemo.delete(identity));
    hashMemo.set(identity, promise);
    while (hashMemo.size > MEMO_ENTRIES) hashMemo.delete(hashMemo.keys().next().value!);
  }
  return promise;
}

/**
 * Make the runtime generation of `inputs` ready on `deps.docker` and return how to mount it.
 * Warm (the volume is ready): no byte copied; a few ms once this process has seen it ready.
 * Cold: built in the builder thread and streamed into the volume by exactly one process of the fleet.
 */
export async function prepareRuntime(deps: RuntimeDeps, inputs: RuntimeInputs, opts: PrepareOptions = {}): Promise<RuntimeGeneration> {
  const started = performance.now();
  checkRuntimeInputs(inputs);
  const { trustReadyMs = 30_000 } = opts;
  // The engine id names the install lock; ask for it (once per client) while the inputs are hashed.
  const engine = engineId(deps.docker, { timeoutMs: opts.callTimeoutMs ?? 30_000 });
  engine.catch(() => undefined);
  const hashedInputs = await hashed(inputs);
  const { generationId } = hashedInputs;
  const volumeName = runtimeVolumeName(deps.volumeScope ?? deps.prefix, generationId);
  const seen = perEngine(trustedReady, deps.docker).get(volumeName);

  let result: Installed;
  if (seen !== undefined && (Date.now() - seen.checkedAt < trustReadyMs || (await stillSameVolume(deps, volumeName, seen, opts)))) {
    result = { warm: true, bytesCopied: 0 };
  } else {
    const flights = perEngine(inflight, deps.docker);
    const running = flights.get(volumeName);
    if (running) {
      await running;
      result = { warm: true, bytesCopied: 0 };
    } else {
      const flight = ensureInstalled(deps, hashedInputs, volumeName, inputs, opts);
      flights.set(volumeName, flight);
      try {
        result = await flight;
      } finally {
        flights.delete(volumeName);
      }
    }
  }
  await deps.redis.hset(runtimeLastUsedKey(deps.prefix), generationId, String(Date.now()));
  const prepareMs = Math.round((performance.now() - started) * 100) / 100;
  const record = { generationId, volumeName, warm: result.warm, prepareMs, bytesCopied: result.bytesCopied };
  if (result.warm && seen !== undefined) deps.log.debug(record, 'runtime prepared');
  else deps.log.info(record, 'runtime prepared');
  return { ...record, mountPath: RUNTIME_MOUNT_PATH, mount: { volumeName, target: RUNTIME_MOUNT_PATH } };
}

/** Whether the volume seen ready is still there, the same one (not removed and created again). */
async function stillSameVolume(deps: RuntimeDeps, volumeName: string, seen: SeenReady, opts: PrepareOptions): Promise<boolean> {
  const info = await inspectVolume(deps.docker, volumeName, { timeoutMs: opts.callTimeoutMs ?? 30_000 });
  if (info !== undefined && info.createdAt === seen.createdAt) {
    seen.checkedAt = Date.now();
    return true;
  }
  perEngine(trustedReady, deps.docker).delete(volumeName);
  return false;
}

async function ensureInstalled(
  deps: RuntimeDeps,
  hashedInputs: HashedInputs,
  volumeName: string,
  inputs: RuntimeInputs,
  opts: PrepareOptions,
): Promise<Installed> {
  const { callTimeoutMs = 30_000, timeoutMs = 300_000, helperImage = DEFAULT_IMAGE, lockTtlMs = 30_000, pollMs = 100, signal } = opts;
  const vdeps: VolumeDeps = { docker: deps.docker, log: deps.log, callTimeoutMs };
  const id = hashedInputs.generationId;
  const ref = { volumeName, generationId: id, prefix: deps.volumeScope ?? deps.prefix };
  const key = runtimeLockKey(deps.prefix, await engineId(deps.docker, { timeoutMs: callTimeoutMs }), id);
  const deadline = Date.now() + timeoutMs;
  const log = deps.log.child({ generationId: id, volumeName });
  let waitedLogged = false;
  const markReady = (createdAt: string) => perEngine(trustedReady, deps.docker).set(volumeName, { checkedAt: Date.now(), createdAt });

  for (;;) {
    signal?.throwIfAborted();
    const seen = await volumeState(vdeps, ref, helperImage);
    if (seen.state === 'ready') {
      markReady(seen.info.createdAt);
      return { warm: true, bytesCopied: 0 };
    }
    const lock = await tryLock(deps.redis, key, {
      ttlMs: lockTtlMs,
      // Renewed through a long install; losing it stops the install's writes (runtime-volume.ts).
      renew: { log, lostReason: (k) => new FleetError('runtime_unavailable', `lost the runtime install lock ${k}`) },
    });
    if (lock) {
      try {
        // Check again under the lock: the previous holder may have finished in between.
        const now = await volumeState(vdeps, ref, helperImage);
        if (now.state === 'ready') {
          markReady(now.info.createdAt);
          return { warm: true, bytesCopied: 0 };
        }
        if (now.state === 'partial') {
          // Not ready and nobody holds the lock: abandoned mid-install (or never ours). Never use it.
          log.warn('discarding a half-installed runtime volume');
          await discardVolume(vdeps, volumeName);
        }
        const installStarted = performance.now();
        const installed = await installGeneration(vdeps, { ref, hashed: hashedInputs, inputs, helperImage, lock });
        log.info({ bytesCopied: installed.bytesCopied, installMs: Math.round(performance.now() - installStarted) }, 'runtime generation installed');
        markReady(installed.createdAt);
        return { warm: false, bytesCopied: installed.bytesCopied };
      } finally {
        await lock.release().catch((err: unknown) => log.warn({ err: (err as Error).message }, 'releasing the runtime install lock failed'));
      }
    }
    if (!waitedLogged) {
      log.info('waiting for another process to install the runtime generation');
      waitedLogged = true;
    }
    while (await isLocked(deps.redis, key)) {
      if (Date.now() > deadline) {
        throw new FleetError('runtime_unavailable', `runtime generation ${id} was still being installed by another process after ${timeoutMs} ms`);
      }
      signal?.throwIfAborted();
      await new Promise((resolve) => setTimeout(resolve, pollMs));
    }
  }
}
