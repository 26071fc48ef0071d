// The lease on one episode's environment: the one owner of its end. It is taken before set-up makes
// anything and learns each part as it exists (the container id as soon as the engine created it, the
// session once it opened, the run folder bind-mounted into it with the model proxy's socket, whether
// it was a warm sandbox claimed from the pool), so whatever phase throws, close ends exactly what was
// opened: the sandbox is handed to the cleanup queue, or removed directly when the queue does not take
// it in time, and the run folder goes last. The cleanup queue and the reaper remove with the same
// removeEnvironment, so an environment of several parts is ended the same way everywhere.
import { rm } from 'node:fs/promises';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { untilAborted } from '../deadlines/deadline.ts';
import { removeContainer, type SandboxSession } from './sandbox-session.ts';
import { environmentKeyOf, removeServiceEnvironment } from './task-services.ts';

/** What the lease needs to end an environment. */
export interface LeaseDeps {
  docker: Docker;
  log: Logger;
  /** Deadline of the direct removal's Docker call. */
  callTimeoutMs: number;
  /** Hand a sandbox (and its environment's key, with task services) to the cleanup queue (EpisodeDeps.scheduleCleanup). */
  scheduleCleanup(episodeId: string, containerId: string, environment?: string): Promise<void>;
}

/**
 * Remove an environment by its container id; one already gone (or being removed) counts as removed.
 * The lease's direct removal, the cleanup queue's remove-sandbox job and the reaper all call this.
 */
export async function removeEnvironment(docker: Docker, containerId: string, timeoutMs: number, environment?: string): Promise<void> {
  // A part of an environment with task services (its holder, a sidecar or the agent's container):
  // every part labelled with its key goes, the volumes last. The key given wins: the container named
  // may be gone while other parts are not (a removal cut short between parts, then retried).
  const key = environment ?? await environmentKeyOf(docker, containerId, timeoutMs);
  if (key !== undefined) return removeServiceEnvironment(docker, key, timeoutMs);
  await removeContainer(docker, containerId, timeoutMs);
}

export class EnvironmentLease {
  #containerId: string | undefined;
  #environment: string | undefined;
  #session: SandboxSession | undefined;
  #pooled = false;
  #seeded = false;
  #runFolder: string | undefined;

  constructor(private readonly deps: LeaseDeps, private readonly episodeId: string) {}

  /** The sandbox's container, known from the moment the engine created it. */
  get containerId(): string | undefined {
    return this.#containerId;
  }

  /** The sandbox's session, once it opened (or was claimed from the pool). */
  get session(): SandboxSession | undefined {
    return this.#session;
  }

  /** The sandbox was a warm one claimed from the worker's pool. */
  get pooled(): boolean {
    return this.#pooled;
  }

  /** The warm sandbox claimed held this task's workspace already (the pool's kind for the task). */
  get seeded(): boolean {
    return this.#seeded;
  }

  /** The host folder bind-mounted into the sandbox (the model proxy's socket is there). */
  get runFolder(): string | undefined {
    return this.#runFolder;
  }

  /**
   * The container exists (its session may not be open yet): from now on the lease ends it. With task
   * services, the namespace holder is registered first and the agent's container replaces it: either
   * ends the whole environment.
   */
  registerContainer(containerId: string, environment?: string): void {
    this.#containerId = containerId;
    this.#environment ??= environment;
  }

  /** The sandbox's session, opened for this episode or claimed warm from the pool with its folder. */
  attach(session: SandboxSession, claimed?: { folder: string; seeded?: boolean }): void {
    this.#containerId = session.containerId;
    this.#session = session;
    if (claimed !== undefined) {
      this.#pooled = true;
      this.#seeded = claimed.seeded === true;
      this.#runFolder = claimed.folder;
    }
  }

  /** The run folder, unless the sandbox already came with one (a claimed sandbox's). */
  useFolder(folder: string): void {
    this.#runFolder ??= folder;
  }

  /** Close the engine's event stream of the sandbox (its OOM state has been read, or its time is up). */
  stopWatching(): void {
    this.#session?.stopWatching();
  }

  /**
   * End the environment: hand the sandbox to the cleanup queue within `handOverSignal`; when the queue
   * does not take it in time the hand-over goes on in the background (Redis may come back) and the
   * sandbox is removed directly meanwhile (the cleanup job then finds it gone, and the reaper finds by
   * its labels what both missed). Last, the run folder: the engine resolves the sandbox's bind mounts
   * for every archive call, so it stays until nothing more is read from the sandbox. Never throws.
   */
  async end(handOverSignal: AbortSignal): Promise<void> {
    const { log } = this.deps;
    const id = this.#containerId;
    if (id !== undefined) {
      const handOver = this.deps.scheduleCleanup(this.episodeId, id, this.#environment);
      const handed = await untilAborted(handOver, handOverSignal).then(() => true, () => false);
      if (!handed) {
        log.warn({ containerId: id }, 'cleanup queue did not take the sandbox in time; removing it directly');
        void handOver.catch((err: unknown) => log.warn({ containerId: id, err: String(err) }, 'cleanup hand-over failed'));
        void removeEnvironment(this.deps.docker, id, this.deps.callTimeoutMs, this.#environment).catch((err: unknown) =>
          log.error({ containerId: id, err: String(err) }, 'sandbox not removed; the reaper will find it by its labels'));
      }
    }
    // Not waited for.
    const folder = this.#runFolder;
    if (folder !== undefined) void rm(folder, { recursive: true, force: true }).catch(() => undefined);
  }
}
