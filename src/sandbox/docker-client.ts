// The Docker engine client and the deadline every call to it runs under. Only src/sandbox imports
// dockerode; everything else sees sandbox sessions.
import { createHash } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import Docker from 'dockerode';
import { untilAborted } from '../deadlines/deadline.ts';
import { EpisodeStop } from '../errors/episode-stop.ts';
import { FleetError } from '../errors/fleet-error.ts';

export type { Docker };

/** Build a client for DOCKER_HOST (unix:///path, tcp://host:port or http://host:port). */
export function createDocker(dockerHost: string): Docker {
  const url = new URL(dockerHost);
  if (url.protocol === 'unix:') return new Docker({ socketPath: url.pathname });
  return new Docker({ host: url.hostname, port: Number(url.port || 2375), protocol: 'http' });
}

export interface CallOptions {
  /** Deadline of this call. */
  timeoutMs: number;
  /** Aborts the call early (the episode was cancelled or is shutting down). */
  signal?: AbortSignal | undefined;
}

interface DockerLikeError {
  statusCode?: number;
  code?: string;
  name?: string;
  message?: string;
  json?: { message?: string } | null;
}

/** The engine's HTTP status behind a dockerode error (or a FleetError wrapping one), if any. */
export function dockerStatusOf(err: unknown): number | undefined {
  const cause = err instanceof FleetError ? err.cause : err;
  return (cause as { statusCode?: number } | undefined)?.statusCode;
}

/** Map a dockerode failure to a FleetError with a code that says whether to retry. */
export function dockerError(what: string, err: unknown): FleetError {
  if (err instanceof FleetError) return err;
  const e = (err ?? {}) as DockerLikeError;
  const detail = e.json?.message ?? e.message ?? String(err);
  if (e.name === 'AbortError' || e.name === 'TimeoutError' || e.code === 'ABORT_ERR') {
    return new FleetError('docker_timeout', `${what}: no answer from the Docker engine in time`, { cause: err });
  }
  if (e.code === 'ECONNREFUSED' || e.code === 'ENOENT' || e.code === 'ECONNRESET' || e.code === 'EPIPE') {
    return new FleetError('docker_unavailable', `${what}: Docker engine unavailable (${e.code})`, { cause: err });
  }
  return new FleetError('docker_error', `${what}: ${detail}`, { cause: err });
}

/** One finished Docker call, as observers see it. */
export interface DockerCallSample {
  /** The call's name, as given to dockerCall ('create container', 'create exec', ...). */
  what: string;
  /** From the call to its settling (or to its deadline), in ms. */
  ms: number;
  /** ok: answered; timeout: no answer by its deadline; aborted: the caller gave up first; error: any other failure. */
  outcome: 'ok' | 'timeout' | 'aborted' | 'error';
}

export type DockerCallObserver = (sample: DockerCallSample) => void;

const observers = new Set<DockerCallObserver>();

/**
 * Be told of every Docker call this process makes through dockerCall, once it settles (the engine's
 * latency, for the worker's admission control). Process-wide: several workers in one process see each
 * other's calls (they share the engine). Returns the function that stops observing.
 */
export function observeDockerCalls(observer: DockerCallObserver): () => void {
  observers.add(observer);
  return () => observers.delete(observer);
}

function notify(sample: DockerCallSample): void {
  for (const observer of observers) {
    try {
      observer(sample);
    } catch {
      // An observer's bug must not fail the call it watched.
    }
  }
}

/**
 * Run one Docker call under a deadline: the call gets an AbortSignal that fires at the deadline or
 * when the caller's signal aborts, and the promise settles by then even if the engine never answers.
 */
export async function dockerCall<T>(
  what: string,
  opts: CallOptions,
  call: (abortSignal: AbortSignal) => Promise<T>,
): Promise<T> {
  const deadline = AbortSignal.timeout(opts.timeoutMs);
  const signal = opts.signal ? AbortSignal.any([opts.signal, deadline]) : deadline;
  // Timed only while someone observes (a call started before the first observer is not reported).
  const started = observers.size > 0 ? performance.now() : undefined;
  const observed = (outcome: DockerCallSample['outcome']) => {
    if (started !== undefined) notify({ what, ms: performance.now() - started, outcome });
  };
  try {
    signal.throwIfAborted();
    const result = await untilAborted(call(signal), signal);
    observed('ok');
    return result;
  } catch (err) {
    observed(opts.signal?.aborted ? 'aborted' : deadline.aborted ? 'timeout' : 'error');
    // A caller that aborts with a reason of its own (a phase deadline, a cancellation) gets it back.
    if (opts.signal?.aborted && (opts.signal.reason instanceof FleetError || opts.signal.reason instanceof EpisodeStop)) throw opts.signal.reason;
    throw dockerError(what, err);
  }
}

/**
 * The engine's disk usage (`docker system df`), as `T` (the parts of its answer the caller reads). The
 * engine runs one at a time and refuses another meanwhile ("a disk usage operation is already
 * running": another worker's, or this one's): asked again after a wait that doubles up to 1 s, until
 * the call's own deadline.
 */
export async function engineDiskUsage<T>(docker: Docker, what: string, opts: CallOptions): Promise<T> {
  const until = Date.now() + opts.timeoutMs;
  for (let wait = 50; ; wait = Math.min(wait * 2, 1_000)) {
    const left = until - Date.now();
    try {
      return await dockerCall(what, { ...opts, timeoutMs: Math.max(1, left) }, (abortSignal) => (docker.df as (o: object) => Promise<T>).call(docker, { abortSignal }));
    } catch (err) {
      const busy = err instanceof FleetError && err.code === 'docker_error' && err.message.includes('disk usage operation is already running');
      if (!busy || until - Date.now() <= wait) throw err;
      await delay(wait, undefined, opts.signal ? { signal: opts.signal } : undefined);
    }
  }
}

const engineIds = new WeakMap<Docker, Promise<string>>();

/**
 * The engine's identity (stable across restarts), asked once per client: tells engines apart when hosts
 * share Redis. The engine's own ID alone does not: engines that share /etc/docker (two on one host, or
 * hosts cloned from one image) share it; with its host name and data root they do not.
 */
export function engineId(docker: Docker, opts: CallOptions): Promise<string> {
  let id = engineIds.get(docker);
  if (!id) {
    id = dockerCall('engine info', opts, (abortSignal) => (docker.info as (opts: object) => Promise<{ ID: string; Name?: string; DockerRootDir?: string }>).call(docker, { abortSignal }))
      .then((info) => `${info.ID}@${createHash('sha256').update(`${info.Name ?? ''}\0${info.DockerRootDir ?? ''}`).digest('hex').slice(0, 12)}`);
    id.catch(() => engineIds.delete(docker));
    engineIds.set(docker, id);
  }
  return id;
}
