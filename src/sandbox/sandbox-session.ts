// One sandbox session = one container per episode, created once and reused for set-up, agent,
// verification and evidence, then closed once. Hardened by default: no network, no capabilities,
// no privilege escalation, memory/CPU/pids/disk limits, a reaping init the sandbox user cannot
// signal, every process the session starts run as a non-root user; every call has a deadline.
// The parts live beside it: the create options in container-spec.ts, processes in sandbox-exec.ts,
// the sweep in sweep.ts, the image-id cache in image-ids.ts, removal in remove-container.ts.
import { posix } from 'node:path';
import type { Readable } from 'node:stream';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { FleetError } from '../errors/fleet-error.ts';
import { isImageReference } from '../tasks/task-spec.ts';
import { containerName, hardenedCreateOptions, type SessionSpec } from './container-spec.ts';
import { dockerCall, dockerStatusOf } from './docker-client.ts';
import { createDiskQuota, diskQuotaRefused } from './disk-quota.ts';
import { forgetImage, imageOf } from './image-ids.ts';
import { forgetPreparedImage, preparedImage } from './prepared-images.ts';
import { watchOomEvents, type OomWatch } from './oom-events.ts';
import type { SandboxOwner } from './labels.ts';
import { removeContainer } from './remove-container.ts';
import { execIn, startBackgroundIn, type ExecOptions, type ExecResult, type ExecTarget } from './sandbox-exec.ts';
import { endOfTurn, type EndOfTurn, type EndOfTurnOptions } from './end-of-turn/end-of-turn.ts';

// Split by concern; the names importers know from this file are still exported from it.
export type { SessionSpec, VolumeMount } from './container-spec.ts';
export { removeContainer } from './remove-container.ts';
export type { ExecOptions, ExecResult } from './sandbox-exec.ts';
export { SANDBOX_USER } from './sandbox-user.ts';

export interface SessionDeps {
  docker: Docker;
  log: Logger;
  /** Deadline of each Docker API call. */
  callTimeoutMs: number;
}

export interface ContainerState {
  running: boolean;
  /** The kernel OOM-killed a process of the sandbox (any process, not only its init) since it was created. */
  oomKilled: boolean;
  /** The kernel OOM-killed the sandbox's init, which stopped the sandbox. */
  initOomKilled: boolean;
  exitCode: number | null;
}

export class SandboxSession {
  private closed = false;

  private constructor(
    private readonly deps: SessionDeps,
    private readonly container: Docker.Container,
    readonly containerId: string,
    readonly imageId: string,
    readonly spec: SessionSpec,
    /** The engine itself caps the writable layer at limits.diskMb (StorageOpt size); else the caller watches it. */
    readonly diskEnforced: boolean,
    private readonly oom: OomWatch | undefined,
  ) {}

  /**
   * Create and start the episode's container. `onCreated` runs as soon as the container exists, before
   * it is started, so the caller can register its removal even if a later step fails.
   */
  static async open(
    deps: SessionDeps,
    spec: SessionSpec,
    onCreated: (containerId: string) => void,
    signal?: AbortSignal,
  ): Promise<SandboxSession> {
    const { docker, callTimeoutMs } = deps;
    const call = { timeoutMs: callTimeoutMs, signal };
    // The name becomes part of the request path: one that is not an image reference never goes out.
    if (!isImageReference(spec.image)) {
      throw new FleetError('image_not_found', `image ${JSON.stringify(spec.image)} is not a valid image reference`);
    }
    const image = await imageOf(docker, spec.image, call);
    const { filesInImage } = spec;
    const prepared = () => (filesInImage === undefined
      ? Promise.resolve(image.Id)
      : preparedImage(docker, image.Id, filesInImage, { prefix: spec.owner.fleet, timeoutMs: callTimeoutMs, log: deps.log }, signal));

    const { limits } = spec;
    const name = containerName(spec);
    const createFrom = (from: string, storageOpt: Record<string, string> | undefined) => dockerCall('create container', call, (abortSignal) =>
      docker.createContainer({ ...hardenedCreateOptions(spec, from, name, storageOpt), abortSignal } as Docker.ContainerCreateOptions & { abortSignal: AbortSignal }),
    );
    const create = async (storageOpt: Record<string, string> | undefined) => {
      const from = await prepared();
      try {
        return await createFrom(from, storageOpt);
      } catch (err) {
        // A prepared image pruned since this process made it: made again, once.
        if (dockerStatusOf(err) !== 404 || filesInImage === undefined) throw err;
        forgetPreparedImage(docker, image.Id, filesInImage);
        return createFrom(await prepared(), storageOpt);
      }
    };
    // Asked of the engine with the first sandbox that has a disk limit; an engine that refuses is remembered.
    const quota = limits.diskMb === undefined ? undefined : createDiskQuota(docker, limits.diskMb);
    let diskEnforced = quota !== undefined;
    const container = await create(quota).catch(async (err: unknown) => {
      // The image id was remembered: an image removed since is asked for again (and then reported).
      if (dockerStatusOf(err) === 404) forgetImage(docker, spec.image);
      if (quota === undefined || !diskQuotaRefused(docker, err)) throw err;
      diskEnforced = false;
      return create(undefined);
    });
    onCreated(container.id);
    if (spec.filesBeforeStart !== undefined) {
      const files = spec.filesBeforeStart;
      await dockerCall('put archive', call, (abortSignal) => container.putArchive(files, { path: '/', abortSignal }));
    }
    // From before the start: an OOM kill of any process in the sandbox is reported, not only of its init.
    const oom = await watchOomEvents(docker, container.id, call).catch((err: unknown) => {
      deps.log.warn({ containerId: container.id, err: String(err) }, 'not watching OOM events; only an OOM kill of init will be seen');
      return undefined;
    });
    const session = new SandboxSession(deps, container, container.id, image.Id, spec, diskEnforced, oom);
    try {
      await dockerCall('start container', call, (abortSignal) => container.start({ abortSignal }));
    } catch (err) {
      // Nobody gets this session: its event stream would stay open (and keep the worker alive) for good.
      session.stopWatching();
      throw err;
    }
    deps.log.debug({ containerId: container.id, image: spec.image }, 'sandbox started');
    return session;
  }

  /** This (pooled) sandbox as the episode `owner`'s: the same container, now the episode's session. */
  adopt(owner: SandboxOwner): SandboxSession {
    return new SandboxSession(this.deps, this.container, this.containerId, this.imageId, { ...this.spec, owner, pooled: false }, this.diskEnforced, this.oom);
  }

  /** Write a tar (entry names relative to `path`) into the container. */
  async putArchive(archive: Buffer | NodeJS.ReadableStream, path = '/', signal?: AbortSignal): Promise<void> {
    await dockerCall('put archive', { timeoutMs: this.deps.callTimeoutMs, signal }, (abortSignal) =>
      this.container.putArchive(archive, { path, abortSignal }),
    );
  }

  /** A tar stream of `path` inside the container. */
  async getArchive(path: string, signal?: AbortSignal): Promise<Readable> {
    return dockerCall('get archive', { timeoutMs: this.deps.callTimeoutMs, signal }, (abortSignal) =>
      this.container.getArchive({ path, abortSignal }),
    ) as Promise<Readable>;
  }

  /** Whether the container still runs and whether the kernel OOM-killed any of its processes. */
  async state(signal?: AbortSignal): Promise<ContainerState> {
    const info = await dockerCall('inspect container', { timeoutMs: this.deps.callTimeoutMs, signal }, (abortSignal) =>
      this.container.inspect({ abortSignal }),
    );
    return {
      running: info.State.Running,
      // State.OOMKilled is set only when init itself was killed; the engine's oom events see every kill.
      oomKilled: info.State.OOMKilled || (this.oom?.count ?? 0) > 0,
      initOomKilled: info.State.OOMKilled,
      exitCode: info.State.Running ? null : info.State.ExitCode,
    };
  }

  /** Whether the container stops within `ms` (the engine's wait, not a poll); false when it still runs then. */
  async stopsWithin(ms: number, signal?: AbortSignal): Promise<boolean> {
    return dockerCall('wait for the container to stop', { timeoutMs: ms, signal }, (abortSignal) =>
      this.container.wait({ condition: 'not-running', abortSignal } as object) as Promise<unknown>,
    ).then(() => true, () => false);
  }

  /**
   * The files of the container's ENTRYPOINT (its program, and the absolute paths among its arguments)
   * changed, added or removed in it since it was created, as the engine's diff of its layer says.
   * Costs a walk of the layer.
   */
  async entrypointChanges(signal?: AbortSignal): Promise<string[]> {
    const opts = { timeoutMs: this.deps.callTimeoutMs, signal };
    const info = await dockerCall('inspect container', opts, (abortSignal) => this.container.inspect({ abortSignal }));
    const entry: unknown = info.Config.Entrypoint;
    const args = Array.isArray(entry) ? entry.filter((a): a is string => typeof a === 'string') : typeof entry === 'string' ? [entry] : [];
    if (args.length === 0) return [];
    const changes = await dockerCall('list the container\'s changes', opts, (abortSignal) =>
      this.container.changes({ abortSignal }) as Promise<Array<{ Path: string }> | null>,
    );
    // A program named without a path is matched by its name in any folder (it was found on PATH).
    const isEntry = (p: string) => args.some((a, i) => (a.startsWith('/') ? p === a : i === 0 && posix.basename(p) === a));
    return (changes ?? []).map((c) => c.Path).filter(isEntry);
  }

  /** Bytes in the sandbox's writable layer (workdir, /tmp, anything outside its mounts). Costs a walk of the layer. */
  async writableLayerBytes(signal?: AbortSignal): Promise<number> {
    const info = await dockerCall('inspect container size', { timeoutMs: this.deps.callTimeoutMs, signal }, (abortSignal) =>
      this.container.inspect({ size: true, abortSignal } as object) as Promise<Docker.ContainerInspectInfo & { SizeRw?: number }>,
    );
    return info.SizeRw ?? 0;
  }

  /**
   * Kill every process in the sandbox and start it again: a fresh init, no process of the agent's
   * left (daemons, a fork bomb, zombies), all its pids and memory free. The files stay. Done by the
   * engine, so it works when the sandbox has no pid left for an exec.
   */
  async restart(signal?: AbortSignal): Promise<void> {
    try {
      await dockerCall('restart container', { timeoutMs: this.deps.callTimeoutMs, signal }, (abortSignal) =>
        this.container.restart({ t: 0, abortSignal }),
      );
    } catch (err) {
      // The sandbox started before the agent's turn; that its working folder is now a file is the
      // agent's doing, not the engine's: an error of the agent's (a retry would only reward breaking it).
      const workdir = err instanceof FleetError && err.code === 'docker_error' ? /Cannot mkdir: (\S+) is not a directory/.exec(err.message) : null;
      if (workdir) throw new FleetError('agent_crashed', `the sandbox cannot start again: its working folder ${workdir[1]} is no longer a folder (the agent made it something else)`, { cause: err });
      throw err;
    }
  }

  /**
   * Whether the sandbox still runs its init: a trivial exec succeeds. It cannot start in a sandbox whose
   * init died, even while the engine still reports it running.
   */
  async alive(signal?: AbortSignal): Promise<boolean> {
    try {
      const run = await this.exec('true', { timeoutMs: this.deps.callTimeoutMs, capBytes: 1024, ...(signal && { signal }) });
      return run.exitCode === 0;
    } catch (err) {
      // A deadline or a cancellation is the caller's business; an engine refusal means not running.
      if (signal?.aborted) throw err;
      return false;
    }
  }

  /**
   * The end of the agent's turn in one exec (end-of-turn/end-of-turn.ts): the sweep, the workspace
   * copied out, the tests in, the verifier run and its reward files read, by the runtime's own node.
   */
  async endTurn(opts: EndOfTurnOptions): Promise<EndOfTurn> {
    return endOfTurn(this.execTarget(), opts);
  }

  /** Whether the kernel OOM-killed a process of the sandbox, from the engine's events; undefined when they are not watched. */
  oomKilledSoFar(): boolean | undefined {
    return this.oom === undefined ? undefined : this.oom.count > 0;
  }

  /** Stop everything in the sandbox at once, through the engine (no exec, so no pid, is needed). */
  async kill(signal?: AbortSignal): Promise<void> {
    try {
      await dockerCall('kill container', { timeoutMs: this.deps.callTimeoutMs, signal }, (abortSignal) =>
        this.container.kill({ signal: 'KILL', abortSignal }),
      );
    } catch (err) {
      // 409: not running any more, which is what was asked.
      if (dockerStatusOf(err) !== 409) throw err;
    }
  }

  /** Stop watching the engine's events for this sandbox (close calls it once the evidence is kept). */
  stopWatching(): void {
    this.oom?.stop();
  }

  /**
   * Run `sh -c command` in the sandbox as SANDBOX_USER. Past `timeoutMs` (or when `signal` aborts) every process of
   * the sandbox user but the container's init is sent TERM, then KILL: the whole tree stops, daemons
   * the command left behind included.
   */
  async exec(command: string, opts: ExecOptions): Promise<ExecResult> {
    return execIn(this.execTarget(), command, opts);
  }

  /**
   * Start `sh -c command` as SANDBOX_USER in the background (a helper the agent uses, such as the
   * model forwarder) and return once it prints its first line on stdout (it is ready). It is not the
   * agent's process, so the agent's exit code stays its own; it stops with the sandbox user's other
   * processes. Rejects, with what it wrote on stderr, when it exits first or is not ready in `timeoutMs`.
   */
  async startBackground(command: string, opts: { timeoutMs: number; env?: Record<string, string>; user?: string; signal?: AbortSignal }): Promise<void> {
    return startBackgroundIn(this.execTarget(), command, opts);
  }

  private execTarget(): ExecTarget {
    const { docker, log, callTimeoutMs } = this.deps;
    const { harbor } = this.spec;
    const { oom } = this;
    return {
      docker, log, callTimeoutMs, container: this.container, containerId: this.containerId, workdir: this.spec.workdir,
      onDie: oom && ((listener) => oom.onDie(listener)),
      // A Harbor task's commands: `bash -c`, as its user or the image's (''), as Harbor runs them.
      ...(harbor && { user: harbor.user ?? '', shell: ['bash', '-c'] }),
    };
  }

  /** Remove the container (and its anonymous volumes). Idempotent: a container already gone counts as removed. */
  async remove(timeoutMs = this.deps.callTimeoutMs): Promise<void> {
    this.stopWatching();
    if (this.closed) return;
    await removeContainer(this.deps.docker, this.containerId, timeoutMs);
    this.closed = true;
  }
}
