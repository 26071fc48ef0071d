// Build a task's environment/ into an image on one Docker engine, with BuildKit, at most once per
// engine and content at a time: one build per process (a shared promise) and per fleet (a Redis lock
// keyed by engine and digest); waiters poll until the builder is done, then find the image. The image
// is named by the content digest, so a changed file builds a new image and an unchanged one is found
// with one inspect. A Dockerfile that fails is the task's fault: the error carries the build log and
// is remembered per engine and digest for a while, so the next sample fails at once instead of
// building again. An engine that fails under the build is infrastructure (retried).
//
// With a registry (FLEET_REGISTRY) an environment is built once for the fleet: the engine lock above
// is still taken (pruning and this engine's other processes respect it), and the build itself also
// takes a lock keyed by the registry and digest, so one host builds while the others wait; it pushes
// the image and records the manifest digest in Redis, and every other host pulls it by that digest
// (image-registry.ts) instead of building. A pull that fails (the registry away, the manifest gone)
// falls back to a build on this engine, logged, then pushed again; a push that fails leaves the image
// usable here and unshared. A failed Dockerfile is remembered for the whole fleet, not per engine.
//
// The build is `POST /build?version=2` sent through the engine client's modem, not
// dockerode's buildImage: for version 2 that opens a BuildKit session first (a hijacked /session
// connection speaking gRPC), which a context sent as the request body does not need. BuildKit tags
// the image only once every step is done, so an aborted build (timeout, lost lock, killed process)
// leaves nothing under the tag.
import type { IncomingMessage } from 'node:http';
import { Readable } from 'node:stream';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { untilAborted } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { envBuildFailureKey, envBuildLockKey, envLastUsedKey } from '../redis/redis-keys.ts';
import { isLocked, tryLock, type HeldLock } from '../redis/token-lock.ts';
import { dockerCall, dockerStatusOf, engineId, type Docker } from '../sandbox/docker-client.ts';
import { LABEL } from '../sandbox/labels.ts';
import { BuildLog } from './buildkit-trace.ts';
import { pullImage, pushImage, recordManifest, recordedManifest } from './image-registry.ts';

/** Repository of every built environment image; the tag is the first 24 hex digits of the digest. */
export const ENV_IMAGE_REPOSITORY = 'rollout-fleet/env';
const DIGEST = /^[0-9a-f]{64}$/;

export function environmentImageTag(digest: string): string {
  return `${ENV_IMAGE_REPOSITORY}:${digest.slice(0, 24)}`;
}

export interface EnvironmentBuildDeps {
  docker: Docker;
  redis: Redis;
  /** The fleet's Redis key prefix: keys live under it, and built images are labelled with it. */
  prefix: string;
  log: Logger;
  /**
   * The registry (host:port, FLEET_REGISTRY) environments are shared through: built once for the
   * fleet, pushed, pulled by the other hosts. Unset: each engine builds its own.
   */
  registry?: string | undefined;
}

export interface EnvironmentBuildSpec {
  /**
   * The build context: a tar of the environment/ folder (uncompressed or gzip). A function is only
   * called by the process that builds; a stream given directly is destroyed unread when another
   * caller builds, or the image exists.
   */
  context: Buffer | Readable | (() => Readable | Buffer | Promise<Readable | Buffer>);
  /** sha256 (hex) of the context and every other input of the build: names the image. */
  digest: string;
  /** The task's build_timeout_sec: the build is aborted past it. */
  timeoutSec: number;
  /** More labels for the image (the task's name, the batch...). */
  labels?: Record<string, string>;
  /** The Dockerfile's path inside the context. @default 'Dockerfile' */
  dockerfile?: string;
  /**
   * The network of RUN steps: none unless the operator's policy allows one (then an engine network
   * mode such as `host` or `default`). @default 'none'
   */
  networkMode?: string;
}

export interface EnvironmentBuildOptions {
  /** Deadline of each Docker call other than the build itself. @default 30000 */
  callTimeoutMs?: number;
  /** TTL of the build lock, renewed every third of it while building. @default 30000 */
  lockTtlMs?: number;
  /** How often a waiter checks whether the builder is done. @default 100 */
  pollMs?: number;
  /** How long a waiter waits for another process's build. @default the build timeout plus 60 s */
  waitTimeoutMs?: number;
  /** How long a failed build is remembered (its digest fails at once meanwhile). @default 3600000 */
  failureTtlMs?: number;
  /** Remember a build that passed its timeout like a failed one. @default true */
  rememberTimeouts?: boolean;
  /** Most bytes of build log kept (the end of it). @default 1048576 */
  logCapBytes?: number;
  /** Stops this call's wait (not the build, which other callers may be waiting for: it has its own timeout). */
  signal?: AbortSignal;
  /** Called once when this call starts waiting for a build (its own or another process's): say so in the episode's status. */
  onWait?: (info: { image: string; builder: 'this-process' | 'other-process' }) => void;
}

export interface EnvironmentImage {
  /** The tag to create containers from. */
  image: string;
  /** The engine's image id. */
  imageId: string;
  digest: string;
  /** This call ran the build (false: the image existed, another caller built it, or it was pulled). */
  built: boolean;
  /** This call pulled it from the registry (another host built it). */
  pulled?: boolean;
  /** The manifest digest this call pushed the image to the registry as. */
  pushed?: string;
  /** How long that push took, in ms (part of readyMs). */
  pushMs?: number;
  /** From the call to the image being there, in ms (the build, or the wait for someone else's). */
  readyMs: number;
  /** The build's log, when this call built it. */
  log?: string;
}

/** A build that failed or passed its timeout: the task's fault, with the build's log. */
export class EnvironmentBuildError extends FleetError {
  constructor(
    code: 'environment_build_failed' | 'environment_build_timeout',
    message: string,
    readonly buildLog: string,
    readonly digest: string,
    /** Failed from the memory of an earlier build (no build ran for this call). */
    readonly remembered: boolean,
  ) {
    super(code, message);
  }
}

interface RememberedFailure {
  code: 'environment_build_failed' | 'environment_build_timeout';
  message: string;
  log: string;
  /** ms since the epoch. */
  at: number;
}

// Builds in flight in this process, per engine client and digest: every caller joins the one promise.
const inflight = new WeakMap<Docker, Map<string, Promise<EnvironmentImage>>>();

function flightsOf(docker: Docker): Map<string, Promise<EnvironmentImage>> {
  let map = inflight.get(docker);
  if (!map) inflight.set(docker, (map = new Map()));
  return map;
}

function checkSpec(spec: EnvironmentBuildSpec): void {
  if (typeof spec.digest !== 'string' || !DIGEST.test(spec.digest)) {
    throw new TypeError(`Expected \`digest\` to be 64 lowercase hex digits (sha256), got \`${String(spec.digest)}\``);
  }
  if (!Number.isFinite(spec.timeoutSec) || spec.timeoutSec <= 0) {
    throw new TypeError(`Expected \`timeoutSec\` to be a positive number, got \`${String(spec.timeoutSec)}\``);
  }
}

/**
 * The image of `spec`'s environment on `deps.docker`: found (one inspect), built by this call, or
 * built by another caller this one waited for. Throws EnvironmentBuildError for a Dockerfile that
 * fails or a build past its timeout (final), FleetError 'environment_build_interrupted' when the
 * engine failed under the build (retried).
 */
export async function ensureEnvironmentImage(
  deps: EnvironmentBuildDeps,
  spec: EnvironmentBuildSpec,
  opts: EnvironmentBuildOptions = {},
): Promise<EnvironmentImage> {
  checkSpec(spec);
  const started = performance.now();
  const image = environmentImageTag(spec.digest);
  const flights = flightsOf(deps.docker);
  let flight = flights.get(spec.digest);
  let joined = true;
  if (!flight) {
    joined = false;
    // The flight is shared: one caller giving up (its signal) must not abort the build the others
    // wait for, so it runs without any caller's signal (bounded by the build timeout and the wait
    // timeout); each caller stops waiting on its own signal.
    flight = ensureOnce(deps, spec, image, { ...opts, signal: undefined });
    flights.set(spec.digest, flight);
    const mine = flight;
    void mine.finally(() => {
      if (flights.get(spec.digest) === mine) flights.delete(spec.digest);
    }).catch(() => undefined);
  } else {
    opts.onWait?.({ image, builder: 'this-process' });
  }
  if (joined && spec.context instanceof Readable) spec.context.destroy();
  const result = await untilAborted(flight, opts.signal);
  const readyMs = Math.round(performance.now() - started);
  // A caller that joined another's flight did not build, whatever the flight did.
  return joined ? { image: result.image, imageId: result.imageId, digest: result.digest, built: false, readyMs } : { ...result, readyMs };
}

/** Where the fleet-wide build lock and failure memory of a registry live (in place of an engine id). */
function registryScope(registry: string): string {
  return `registry/${registry}`;
}

async function inspectImage(docker: Docker, image: string, timeoutMs: number): Promise<{ Id: string } | undefined> {
  // Image.inspect takes no abort signal (it would become a query parameter); dockerCall's race bounds it.
  try {
    return await dockerCall('inspect image', { timeoutMs }, () => docker.getImage(image).inspect());
  } catch (err) {
    if (dockerStatusOf(err) === 404) return undefined;
    throw err;
  }
}

async function rememberedFailure(redis: Redis, key: string, digest: string): Promise<EnvironmentBuildError | undefined> {
  const raw = await redis.get(key);
  if (raw === null) return undefined;
  let failure: RememberedFailure;
  try {
    failure = JSON.parse(raw) as RememberedFailure;
  } catch {
    return undefined; // not ours to trust: build again
  }
  const when = new Date(failure.at).toISOString();
  return new EnvironmentBuildError(failure.code, `${failure.message} (remembered from the build at ${when})`, failure.log, digest, true);
}

async function ensureOnce(deps: EnvironmentBuildDeps, spec: EnvironmentBuildSpec, image: string, opts: EnvironmentBuildOptions): Promise<EnvironmentImage> {
  const { callTimeoutMs = 30_000, lockTtlMs = 30_000, pollMs = 100 } = opts;
  const waitTimeoutMs = opts.waitTimeoutMs ?? spec.timeoutSec * 1000 + 60_000;
  const engine = await engineId(deps.docker, { timeoutMs: callTimeoutMs });
  const lockKey = envBuildLockKey(deps.prefix, engine, spec.digest);
  // With a registry a failed Dockerfile is the fleet's to remember: no other host builds it again.
  const failureKey = envBuildFailureKey(deps.prefix, deps.registry !== undefined ? registryScope(deps.registry) : engine, spec.digest);
  const log = deps.log.child({ environment: image, digest: spec.digest });
  const found = async (): Promise<EnvironmentImage | undefined> => {
    const info = await inspectImage(deps.docker, image, callTimeoutMs);
    if (!info) return undefined;
    await touch(deps, engine, image);
    return { image, imageId: info.Id, digest: spec.digest, built: false, readyMs: 0 };
  };
  const unused = () => {
    if (spec.context instanceof Readable) spec.context.destroy();
  };

  let waitedSince: number | undefined;
  for (;;) {
    const existing = await found();
    if (existing) return (unused(), existing);
    const failed = await rememberedFailure(deps.redis, failureKey, spec.digest);
    if (failed) throw (unused(), failed);

    const lock = await tryLock(deps.redis, lockKey, {
      ttlMs: lockTtlMs,
      renew: { log, lostReason: (k) => new FleetError('environment_build_interrupted', `lost the environment build lock ${k}`) },
    });
    if (lock) {
      try {
        // Check again under the lock: the previous holder may have finished in between.
        const now = await found();
        if (now) return (unused(), now);
        const failedNow = await rememberedFailure(deps.redis, failureKey, spec.digest);
        if (failedNow) throw (unused(), failedNow);
        if (waitedSince === undefined) opts.onWait?.({ image, builder: 'this-process' });
        if (deps.registry !== undefined) return await viaRegistry(deps, deps.registry, spec, image, opts, { engine, failureKey, lock, log });
        return await buildLocked(deps, spec, image, opts, { engine, failureKey, lockSignal: lock.signal, log });
      } finally {
        await lock.release().catch((err: unknown) => log.warn({ err: (err as Error).message }, 'releasing the environment build lock failed'));
      }
    }
    if (waitedSince === undefined) {
      waitedSince = Date.now();
      log.info('waiting for another process to build the environment');
      opts.onWait?.({ image, builder: 'other-process' });
    }
    while (await isLocked(deps.redis, lockKey)) {
      if (Date.now() - waitedSince > waitTimeoutMs) {
        throw new FleetError('environment_build_interrupted', `environment ${image} was still being built by another process after ${waitTimeoutMs} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, pollMs));
    }
  }
}

/**
 * Under this engine's lock, with a registry: pull what another host pushed; else build under the
 * fleet-wide lock (or wait for the host that holds it, then pull) and push.
 */
async function viaRegistry(
  deps: EnvironmentBuildDeps,
  registry: string,
  spec: EnvironmentBuildSpec,
  image: string,
  opts: EnvironmentBuildOptions,
  held: { engine: string; failureKey: string; lock: HeldLock; log: Logger },
): Promise<EnvironmentImage> {
  const { lockTtlMs = 30_000, pollMs = 100 } = opts;
  const waitTimeoutMs = opts.waitTimeoutMs ?? spec.timeoutSec * 1000 + 60_000;
  const { log } = held;
  const fleetLockKey = envBuildLockKey(deps.prefix, registryScope(registry), spec.digest);
  let waitedSince: number | undefined;
  for (;;) {
    const manifest = await recordedManifest(deps.redis, deps.prefix, registry, spec.digest);
    if (manifest !== undefined) {
      const pulled = await pullFromRegistry(deps, registry, spec, image, manifest, opts, held);
      if (pulled) return pulled;
      // The registry is away or lost it: build here (never a wrong image), and share it again.
      return await buildAndPush(deps, registry, spec, image, opts, { ...held, lockSignal: held.lock.signal });
    }
    const failed = await rememberedFailure(deps.redis, held.failureKey, spec.digest);
    if (failed) throw failed;
    const fleetLock = await tryLock(deps.redis, fleetLockKey, {
      ttlMs: lockTtlMs,
      renew: { log, lostReason: (k) => new FleetError('environment_build_interrupted', `lost the fleet's environment build lock ${k}`) },
    });
    if (fleetLock) {
      try {
        // Pushed, or failed, by the previous holder in between: see above.
        if (await recordedManifest(deps.redis, deps.prefix, registry, spec.digest) !== undefined) continue;
        const failedNow = await rememberedFailure(deps.redis, held.failureKey, spec.digest);
        if (failedNow) throw failedNow;
        return await buildAndPush(deps, registry, spec, image, opts, { ...held, lockSignal: AbortSignal.any([held.lock.signal, fleetLock.signal]) });
      } finally {
        await fleetLock.release().catch((err: unknown) => log.warn({ err: (err as Error).message }, 'releasing the fleet\'s environment build lock failed'));
      }
    }
    if (waitedSince === undefined) {
      waitedSince = Date.now();
      log.info({ registry }, 'waiting for another host to build and push the environment');
    }
    while (await isLocked(deps.redis, fleetLockKey)) {
      held.lock.signal.throwIfAborted();
      if (Date.now() - waitedSince > waitTimeoutMs) {
        throw new FleetError('environment_build_interrupted', `environment ${image} was still being built by another host after ${waitTimeoutMs} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, pollMs));
    }
  }
}

/** The image pulled by its recorded manifest digest and tagged as if built here; undefined (logged) when the pull fails. */
async function pullFromRegistry(
  deps: EnvironmentBuildDeps,
  registry: string,
  spec: EnvironmentBuildSpec,
  image: string,
  manifest: string,
  opts: EnvironmentBuildOptions,
  held: { engine: string; log: Logger },
): Promise<EnvironmentImage | undefined> {
  const { callTimeoutMs = 30_000 } = opts;
  const started = performance.now();
  try {
    const imageId = await pullImage(
      deps.docker,
      { registry, repository: ENV_IMAGE_REPOSITORY, manifest },
      { repo: ENV_IMAGE_REPOSITORY, tag: image.slice(ENV_IMAGE_REPOSITORY.length + 1) },
      // Pulled by digest, so the bytes are what was pushed; the labels make sure what was recorded is this environment.
      { [LABEL.envDigest]: spec.digest, [LABEL.envPrefix]: deps.prefix },
      { timeoutMs: Math.round(spec.timeoutSec * 1000), callTimeoutMs },
    );
    await touch(deps, held.engine, image);
    const pullMs = Math.round(performance.now() - started);
    held.log.info({ registry, manifest, pullMs, imageId }, 'environment image pulled from the registry');
    return { image, imageId, digest: spec.digest, built: false, pulled: true, readyMs: pullMs };
  } catch (err) {
    held.log.warn({ registry, manifest, err: (err as Error).message }, 'pulling the environment image from the registry failed: building it on this engine instead');
    return undefined;
  }
}

/** Build on this engine, then push and record the manifest digest (a failed push is logged: the image is still good here). */
async function buildAndPush(
  deps: EnvironmentBuildDeps,
  registry: string,
  spec: EnvironmentBuildSpec,
  image: string,
  opts: EnvironmentBuildOptions,
  held: { engine: string; failureKey: string; lockSignal: AbortSignal; log: Logger },
): Promise<EnvironmentImage> {
  const built = await buildLocked(deps, spec, image, opts, held);
  const started = performance.now();
  try {
    const manifest = await pushImage(
      deps.docker,
      image,
      { registry, repository: ENV_IMAGE_REPOSITORY, tag: image.slice(ENV_IMAGE_REPOSITORY.length + 1) },
      { timeoutMs: Math.round(spec.timeoutSec * 1000), callTimeoutMs: opts.callTimeoutMs ?? 30_000 },
    );
    await recordManifest(deps.redis, deps.prefix, registry, spec.digest, manifest);
    const pushMs = Math.round(performance.now() - started);
    held.log.info({ registry, manifest, pushMs }, 'environment image pushed to the registry');
    return { ...built, pushed: manifest, pushMs };
  } catch (err) {
    held.log.warn({ registry, err: (err as Error).message }, 'pushing the environment image to the registry failed: other hosts build their own');
    return built;
  }
}

/** Record that the image was asked for now (pruning removes the least recently used). */
async function touch(deps: EnvironmentBuildDeps, engine: string, image: string): Promise<void> {
  await deps.redis.hset(envLastUsedKey(deps.prefix, engine), image, String(Date.now()));
}

async function contextBody(context: EnvironmentBuildSpec['context']): Promise<Readable | Buffer> {
  return typeof context === 'function' ? await context() : context;
}

/** Messages of engine trouble that reach the build's answer as an error line: not the Dockerfile's fault. */
const ENGINE_TROUBLE = /no space left on device|connection reset by peer|transport is closing|broken pipe|input\/output error|context canceled/i;

async function buildLocked(
  deps: EnvironmentBuildDeps,
  spec: EnvironmentBuildSpec,
  image: string,
  opts: EnvironmentBuildOptions,
  held: { engine: string; failureKey: string; lockSignal: AbortSignal; log: Logger },
): Promise<EnvironmentImage> {
  const { failureTtlMs = 3_600_000, rememberTimeouts = true, logCapBytes = 1 << 20, callTimeoutMs = 30_000 } = opts;
  const { log } = held;
  const buildLog = new BuildLog(logCapBytes);
  const startedAt = new Date();
  const started = performance.now();
  const timeoutMs = Math.round(spec.timeoutSec * 1000);
  const abort = new AbortController();
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    abort.abort(new Error(`build_timeout_sec ${spec.timeoutSec} passed`));
  }, timeoutMs);
  const onLost = () => abort.abort(held.lockSignal.reason);
  held.lockSignal.addEventListener('abort', onLost, { once: true });

  const labels: Record<string, string> = {
    ...spec.labels,
    [LABEL.envDigest]: spec.digest,
    [LABEL.envPrefix]: deps.prefix,
    [LABEL.envBuiltAt]: startedAt.toISOString(),
  };
  const query = {
    t: image,
    version: '2',
    networkmode: spec.networkMode ?? 'none',
    dockerfile: spec.dockerfile ?? 'Dockerfile',
    labels,
    rm: true,
    forcerm: true,
  };
  log.info({ networkMode: query.networkmode, timeoutSec: spec.timeoutSec }, 'building environment image');

  let body: Readable | Buffer | undefined;
  let errorLine: string | undefined;
  let res: IncomingMessage | undefined;
  try {
    body = await contextBody(spec.context);
    const sent = body;
    res = await new Promise<IncomingMessage>((resolve, reject) => {
      (deps.docker.modem as { dial: (o: object, cb: (err: unknown, data: unknown) => void) => void }).dial(
        {
          path: '/build?',
          method: 'POST',
          file: sent,
          options: query,
          abortSignal: abort.signal,
          isStream: true,
          statusCodes: { 200: true, 400: 'bad parameter', 500: 'server error' },
        },
        (err, data) => (err ? reject(err) : resolve(data as IncomingMessage)),
      );
    });
    let pending = '';
    const onLine = (line: string) => {
      if (line.trim() === '') return;
      let entry: unknown;
      try {
        entry = JSON.parse(line);
      } catch {
        buildLog.append(`${line}\n`);
        return;
      }
      buildLog.addLine(entry);
      const e = entry as { error?: unknown; errorDetail?: { message?: unknown } };
      if (errorLine === undefined && (typeof e.error === 'string' || typeof e.errorDetail?.message === 'string')) {
        errorLine = typeof e.errorDetail?.message === 'string' ? e.errorDetail.message : String(e.error);
      }
    };
    for await (const chunk of res) {
      pending += (chunk as Buffer).toString('utf8');
      let nl: number;
      while ((nl = pending.indexOf('\n')) >= 0) {
        onLine(pending.slice(0, nl));
        pending = pending.slice(nl + 1);
      }
    }
    onLine(pending);
  } catch (err) {
    if (timedOut) {
      throw await failTask(deps, held, spec, 'environment_build_timeout', `environment ${image}: the build passed build_timeout_sec (${spec.timeoutSec} s) and was aborted`, buildLog, rememberTimeouts ? failureTtlMs : 0);
    }
    if (err instanceof FleetError) throw err;
    if (abort.signal.aborted && abort.signal.reason instanceof FleetError) throw abort.signal.reason;
    const status = dockerStatusOf(err);
    const detail = (err as { json?: { message?: string } }).json?.message ?? (err as Error).message ?? String(err);
    if (status === 400) {
      // The engine refused the request as given (a Dockerfile path that is not in the context...).
      throw await failTask(deps, held, spec, 'environment_build_failed', `environment ${image}: the engine refused the build: ${detail}`, buildLog, failureTtlMs);
    }
    log.warn({ err: detail, status }, 'the engine failed under an environment build');
    throw new FleetError('environment_build_interrupted', `environment ${image}: the engine failed under the build: ${detail}`, { cause: err });
  } finally {
    clearTimeout(timer);
    held.lockSignal.removeEventListener('abort', onLost);
    if (body instanceof Readable) body.destroy();
    res?.destroy();
  }

  const buildMs = Math.round(performance.now() - started);
  if (errorLine !== undefined) {
    if (ENGINE_TROUBLE.test(errorLine)) {
      log.warn({ err: errorLine, buildMs }, 'the engine failed under an environment build');
      throw new FleetError('environment_build_interrupted', `environment ${image}: the engine failed under the build: ${errorLine}`);
    }
    throw await failTask(deps, held, spec, 'environment_build_failed', `environment ${image}: the Dockerfile failed to build: ${errorLine}`, buildLog, failureTtlMs);
  }
  const info = await inspectImage(deps.docker, image, callTimeoutMs);
  if (!info) {
    throw new FleetError('environment_build_interrupted', `environment ${image}: the build answered without an error but the image is not there`);
  }
  await touch(deps, held.engine, image);
  log.info({ buildMs, imageId: info.Id }, 'environment image built');
  return { image, imageId: info.Id, digest: spec.digest, built: true, readyMs: buildMs, log: buildLog.text() };
}

/** The task's build failure, remembered for `ttlMs` (0: not remembered) so the next sample fails at once. */
async function failTask(
  deps: EnvironmentBuildDeps,
  held: { failureKey: string; log: Logger },
  spec: EnvironmentBuildSpec,
  code: RememberedFailure['code'],
  message: string,
  buildLog: BuildLog,
  ttlMs: number,
): Promise<EnvironmentBuildError> {
  const text = buildLog.text();
  held.log.warn({ code, err: message }, 'environment build failed');
  if (ttlMs > 0) {
    const failure: RememberedFailure = { code, message, log: text, at: Date.now() };
    await deps.redis.set(held.failureKey, JSON.stringify(failure), 'PX', ttlMs).catch((err: unknown) => {
      held.log.warn({ err: (err as Error).message }, 'remembering the failed environment build failed');
    });
  }
  return new EnvironmentBuildError(code, message, text, spec.digest, false);
}
