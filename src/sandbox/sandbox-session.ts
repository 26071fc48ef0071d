// One sandbox session = one container per episode, created once and reused for set-up, agent,
// verification and evidence, then closed once. Hardened by default: no network, no capabilities,
// no privilege escalation, memory/CPU/pids/disk limits, a reaping init the sandbox user cannot
// signal, every process the session starts run as a non-root user; every call has a deadline.
import { posix } from 'node:path';
import { Writable, type Readable } from 'node:stream';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { untilAborted } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { shellQuote } from '../files/shell-quote.ts';
import { isImageReference } from '../tasks/task-spec.ts';
import { OutputCapture, type CapturedOutput } from './captured-output.ts';
import { containerName, hardenedCreateOptions, type SessionSpec } from './container-spec.ts';
import { dockerCall, dockerError, dockerStatusOf } from './docker-client.ts';
import { createDiskQuota, diskQuotaRefused } from './disk-quota.ts';
import { forgetImage, imageOf } from './image-ids.ts';
import { watchOomEvents, type OomWatch } from './oom-events.ts';
import type { SandboxOwner } from './labels.ts';
import { removeContainer } from './remove-container.ts';
import { SANDBOX_USER, SANDBOX_USER_SPEC } from './sandbox-user.ts';

// Split by concern; the names importers know from this file are still exported from it.
export type { SessionSpec, VolumeMount } from './container-spec.ts';
export { removeContainer } from './remove-container.ts';
export { SANDBOX_USER } from './sandbox-user.ts';

/**
 * The sweep, in builtins only (a fork would need a pid the agent may have used up): KILL every process
 * the sandbox user may signal (kill -1 spares the caller), then count what is left of the user's that
 * is not a zombie; again while a fork bomb outruns a pass, at most 20 times. Exit 0 once none is left,
 * 3 when they kept coming. With `copy`, once none is left, the workspace as the agent left it goes to
 * stdout as a tar (entries named as getArchive names them), cut at `capBytes` + 1, and what tar could
 * not read to stderr (the sweep itself is quiet); then the sweep runs again, since `tar` and `head` are
 * found in PATH, which an image may let the sandbox user write to (test/integration/sandbox.test.ts).
 */
function sweepScript(copy?: { dir: string; capBytes: number }): string {
  const sweep = [
    'i=0',
    'while [ $i -lt 20 ]; do',
    '  kill -KILL -1',
    '  n=0',
    '  for d in /proc/[0-9]*; do',
    '    [ "${d#/proc/}" = "$$" ] && continue',
    '    uid=; st=',
    '    while read -r k v _; do case "$k" in State:) st=$v;; Uid:) uid=$v;; esac; done < "$d/status"',
    `    [ "$uid" = "${SANDBOX_USER.uid}" ] && [ "$st" != "Z" ] && n=$((n+1))`,
    '  done',
    '  [ $n -eq 0 ] && break',
    '  i=$((i+1))',
    'done',
    '[ $n -eq 0 ] || exit 3',
  ];
  // Quiet: a process that ends between the glob and its read is not an error.
  const lines = ['exec 3>&2 2>/dev/null', ...sweep];
  if (copy !== undefined) {
    const { dir, base } = { dir: posix.dirname(copy.dir), base: posix.basename(copy.dir) };
    lines.push(`{ tar -C ${shellQuote(dir)} -cf - ${shellQuote(base)} || echo 'tar failed' >&2; } 2>&3 | head -c ${copy.capBytes + 1}`, ...sweep);
  }
  lines.push('exit 0');
  return lines.join('\n');
}
const SWEEP_TIMEOUT_MS = 5_000;

/** How long a TERM-ed process tree gets before KILL. */
const KILL_GRACE_MS = 2_000;

export interface SessionDeps {
  docker: Docker;
  log: Logger;
  /** Deadline of each Docker API call. */
  callTimeoutMs: number;
}

export interface ExecOptions {
  /** The process tree is stopped (TERM, then KILL) after this long. */
  timeoutMs: number;
  /** Cap of each captured stream. */
  capBytes: number;
  workdir?: string;
  env?: Record<string, string>;
  signal?: AbortSignal;
  /** Sees every stdout chunk as it arrives, before capping (an agent's event stream). */
  onStdout?: (chunk: Buffer) => void;
}

export interface ExecResult {
  /** null when the process was killed before it reported one. */
  exitCode: number | null;
  /** The timeout passed and the process tree was stopped. */
  timedOut: boolean;
  /** The caller's signal aborted (cancellation, drain) and the process tree was stopped. */
  aborted: boolean;
  stdout: CapturedOutput;
  stderr: CapturedOutput;
  durationMs: number;
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

    const { limits } = spec;
    const name = containerName(spec);
    const create = (storageOpt: Record<string, string> | undefined) => dockerCall('create container', call, (abortSignal) =>
      docker.createContainer({ ...hardenedCreateOptions(spec, image.Id, name, storageOpt), abortSignal } as Docker.ContainerCreateOptions & { abortSignal: AbortSignal }),
    );
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
    await dockerCall('restart container', { timeoutMs: this.deps.callTimeoutMs, signal }, (abortSignal) =>
      this.container.restart({ t: 0, abortSignal }),
    );
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
   * Kill every process of the sandbox user, from one exec, until none is left: the cheap way to what
   * restart() does (a round trip of about a millisecond instead of 200 to 350 ms). `swept` is true when
   * the sandbox ran the exec and no process of the agent's is left (zombies aside: init reaps them);
   * false when the exec could not run (no pid left, the sandbox stopped) or processes kept coming: then
   * restart(). With `copy`, the same exec then tars the workspace as the agent left it (nothing of the
   * agent's can change it any more), as getArchive would, saving the engine's own archive call: `tar`
   * is that copy, or undefined when the image has no tar or head, the sandbox user could not read
   * everything, or it came to more than `capBytes` (the caller then asks the engine).
   */
  async sweepProcesses(signal?: AbortSignal, copy?: { dir: string; capBytes: number }): Promise<{ swept: boolean; tar?: Buffer }> {
    const chunks: Buffer[] = [];
    let bytes = 0;
    const usable = copy !== undefined && copy.dir.startsWith('/') && posix.basename(copy.dir) !== '';
    try {
      const run = await this.exec(sweepScript(usable ? copy : undefined), {
        timeoutMs: SWEEP_TIMEOUT_MS,
        capBytes: 1024,
        workdir: '/',
        ...(signal && { signal }),
        onStdout: (chunk) => {
          bytes += chunk.length;
          if (bytes <= copy!.capBytes) chunks.push(chunk);
        },
      });
      const swept = run.exitCode === 0;
      const whole = usable && swept && !run.timedOut && run.stderr.totalBytes === 0 && bytes > 0 && bytes <= copy.capBytes;
      return { swept, ...(whole && { tar: Buffer.concat(chunks) }) };
    } catch (err) {
      if (signal?.aborted) throw err;
      return { swept: false };
    }
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
    const started = performance.now();
    const { exec, stream } = await this.startExec(command, opts);
    const stdout = new OutputCapture(opts.capBytes);
    const stderr = new OutputCapture(opts.capBytes);
    const onStdout = opts.onStdout;
    const stdoutSink = onStdout === undefined ? stdout.writable : new Writable({
      write(chunk: Buffer, _enc, cb) {
        onStdout(chunk);
        stdout.writable.write(chunk, cb);
      },
    });
    this.deps.docker.modem.demuxStream(stream, stdoutSink, stderr.writable);

    const ended = new Promise<void>((resolve) => {
      stream.once('end', resolve);
      stream.once('close', resolve);
      stream.once('error', () => resolve());
    });
    const timeout = AbortSignal.timeout(opts.timeoutMs);
    const limit = opts.signal ? AbortSignal.any([timeout, opts.signal]) : timeout;
    const stopped = new Promise<'stopped'>((resolve) => {
      if (limit.aborted) resolve('stopped');
      else limit.addEventListener('abort', () => resolve('stopped'), { once: true });
    });
    const first = await Promise.race([ended.then(() => 'ended' as const), stopped]);
    const aborted = first === 'stopped' && opts.signal?.aborted === true;
    const timedOut = first === 'stopped' && !aborted;
    if (first === 'stopped') {
      await this.stopProcesses(ended);
      stream.destroy();
    }
    let exitCode: number | null = null;
    try {
      const info = await dockerCall('inspect exec', { timeoutMs: this.deps.callTimeoutMs }, (abortSignal) =>
        exec.inspect({ abortSignal } as object) as Promise<Docker.ExecInspectInfo>,
      );
      exitCode = info.ExitCode ?? null;
    } catch (err) {
      if (first !== 'stopped') throw err;
    }
    return {
      exitCode,
      timedOut,
      aborted,
      stdout: stdout.result(),
      stderr: stderr.result(),
      durationMs: Math.round(performance.now() - started),
    };
  }

  /** Create and start `sh -c command` as SANDBOX_USER, attached to its stdout and stderr. */
  private async startExec(command: string, opts: { workdir?: string | undefined; env?: Record<string, string> | undefined; signal?: AbortSignal | undefined }) {
    const call = { timeoutMs: this.deps.callTimeoutMs, signal: opts.signal };
    const exec = await dockerCall('create exec', call, (abortSignal) =>
      this.container.exec({
        Cmd: ['sh', '-c', command],
        AttachStdout: true,
        AttachStderr: true,
        AttachStdin: false,
        Tty: false,
        User: SANDBOX_USER_SPEC,
        WorkingDir: opts.workdir ?? this.spec.workdir,
        Env: Object.entries(opts.env ?? {}).map(([k, v]) => `${k}=${v}`),
        abortSignal,
      } as Docker.ExecCreateOptions & { abortSignal: AbortSignal }),
    );
    const stream = (await dockerCall('start exec', call, (abortSignal) =>
      exec.start({ hijack: true, stdin: false, abortSignal } as Docker.ExecStartOptions),
    )) as NodeJS.ReadWriteStream & Readable;
    return { exec, stream };
  }

  /**
   * Start `sh -c command` as SANDBOX_USER in the background (a helper the agent uses, such as the
   * model forwarder) and return once it prints its first line on stdout (it is ready). It is not the
   * agent's process, so the agent's exit code stays its own; it stops with the sandbox user's other
   * processes. Rejects, with what it wrote on stderr, when it exits first or is not ready in `timeoutMs`.
   */
  async startBackground(command: string, opts: { timeoutMs: number; env?: Record<string, string>; signal?: AbortSignal }): Promise<void> {
    const { stream } = await this.startExec(command, opts);
    const stdout = new OutputCapture(1024);
    const stderr = new OutputCapture(4096);
    const ready = new Promise<boolean>((resolve) => {
      const check = new Writable({
        write(chunk: Buffer, _enc, cb) {
          if (chunk.includes(0x0a)) resolve(true);
          stdout.writable.write(chunk, cb);
        },
      });
      this.deps.docker.modem.demuxStream(stream, check, stderr.writable);
      stream.once('end', () => resolve(false));
      stream.once('close', () => resolve(false));
      stream.once('error', () => resolve(false));
    });
    const limit = AbortSignal.any([AbortSignal.timeout(opts.timeoutMs), ...(opts.signal ? [opts.signal] : [])]);
    try {
      const started = await untilAborted(ready, limit).catch(() => undefined);
      if (started === true) return;
      const why = started === false ? 'exited before it was ready' : `was not ready within ${opts.timeoutMs} ms`;
      const said = stderr.result().text.trim();
      throw new FleetError('runtime_unavailable', `background process ${why}${said !== '' ? `: ${said.slice(0, 500)}` : ''}`);
    } finally {
      // Detached from here: it keeps running, and the engine's copy of its output goes nowhere.
      stream.destroy();
    }
  }

  /** TERM every process of the sandbox user, then KILL what is left after a grace period. */
  private async stopProcesses(ended: Promise<void>): Promise<void> {
    for (const sig of ['TERM', 'KILL'] as const) {
      await this.signalAll(sig);
      const grace = new Promise<'grace'>((resolve) => setTimeout(resolve, KILL_GRACE_MS, 'grace').unref());
      if ((await Promise.race([ended.then(() => 'ended' as const), grace])) === 'ended') return;
    }
    this.deps.log.warn({ containerId: this.containerId }, 'process tree still attached after KILL');
  }

  private async signalAll(sig: 'TERM' | 'KILL', signal?: AbortSignal): Promise<void> {
    const call = { timeoutMs: this.deps.callTimeoutMs, signal };
    try {
      const exec = await dockerCall('create kill exec', call, (abortSignal) =>
        this.container.exec({ Cmd: ['kill', `-${sig}`, '-1'], User: SANDBOX_USER_SPEC, AttachStdout: true, AttachStderr: true, abortSignal } as never),
      );
      const stream = (await dockerCall('start kill exec', call, (abortSignal) =>
        exec.start({ hijack: true, stdin: false, abortSignal } as Docker.ExecStartOptions),
      )) as Readable;
      stream.resume();
      await new Promise<void>((resolve) => {
        stream.once('end', resolve);
        stream.once('close', resolve);
        stream.once('error', () => resolve());
      });
    } catch (err) {
      this.deps.log.warn({ containerId: this.containerId, err: dockerError('kill', err).message }, 'signalling the sandbox failed');
    }
  }

  /** Remove the container (and its anonymous volumes). Idempotent: a container already gone counts as removed. */
  async remove(timeoutMs = this.deps.callTimeoutMs): Promise<void> {
    this.stopWatching();
    if (this.closed) return;
    await removeContainer(this.deps.docker, this.containerId, timeoutMs);
    this.closed = true;
  }
}
