// Processes in a sandbox: `sh -c` as the sandbox user through the engine's exec, its stdout and stderr
// demultiplexed and capped, the whole tree of the sandbox user's processes stopped (TERM, then KILL)
// past a deadline or on the caller's signal; and helpers started in the background.
import { Writable, type Readable } from 'node:stream';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { untilAborted } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { OutputCapture, type CapturedOutput } from './captured-output.ts';
import { dockerCall, dockerError } from './docker-client.ts';
import { SANDBOX_USER_SPEC } from './sandbox-user.ts';

/** How long a TERM-ed process tree gets before KILL. */
const KILL_GRACE_MS = 2_000;

/** The container processes are started in, and what starting one takes. */
export interface ExecTarget {
  docker: Docker;
  log: Logger;
  /** Deadline of each Docker API call. */
  callTimeoutMs: number;
  container: Docker.Container;
  containerId: string;
  /** Where a command runs when it names no workdir of its own. */
  workdir: string;
  /** Who runs a command that names no user of its own ('' is the image's USER). @default SANDBOX_USER */
  user?: string;
  /** What runs each command: `sh -c` (the fleet's tasks) or `bash -c` (Harbor's). @default ['sh', '-c'] */
  shell?: readonly string[];
  /** Calls its listener when the container dies (every process of it gone); returns its removal. */
  onDie?: ((listener: () => void) => () => void) | undefined;
}

export interface ExecOptions {
  /** The process tree is stopped (TERM, then KILL) after this long. */
  timeoutMs: number;
  /** Cap of each captured stream. */
  capBytes: number;
  workdir?: string;
  env?: Record<string, string>;
  /** The user to run as ('' is the image's USER). @default the target's user */
  user?: string;
  signal?: AbortSignal;
  /** Sees every stdout chunk as it arrives, before capping (an agent's event stream). */
  onStdout?: (chunk: Buffer) => void;
  /** Bytes written to the process's stdin once it starts (its stdin is closed when there are none). */
  stdin?: Buffer;
}

export interface ExecResult {
  /** null when the process was killed before it reported one. */
  exitCode: number | null;
  /** The sandbox stopped under the exec (its init died, an OOM kill under gVisor, the runtime itself exited). */
  sandboxStopped?: true;
  /** The timeout passed and the process tree was stopped. */
  timedOut: boolean;
  /** The caller's signal aborted (cancellation, drain) and the process tree was stopped. */
  aborted: boolean;
  stdout: CapturedOutput;
  stderr: CapturedOutput;
  durationMs: number;
}

/**
 * Run `sh -c command` (or the argv `command`, as it is) in the sandbox as SANDBOX_USER. Past
 * `timeoutMs` (or when `signal` aborts) every process of the sandbox user but the container's init is
 * sent TERM, then KILL: the whole tree stops, daemons the command left behind included.
 */
export async function execIn(target: ExecTarget, command: string | readonly string[], opts: ExecOptions): Promise<ExecResult> {
  const started = performance.now();
  const { exec, stream } = await startExec(target, command, opts);
  if (opts.stdin !== undefined) stream.write(opts.stdin);
  const stdout = new OutputCapture(opts.capBytes);
  const stderr = new OutputCapture(opts.capBytes);
  const onStdout = opts.onStdout;
  const stdoutSink = onStdout === undefined ? stdout.writable : new Writable({
    write(chunk: Buffer, _enc, cb) {
      onStdout(chunk);
      stdout.writable.write(chunk, cb);
    },
  });
  target.docker.modem.demuxStream(stream, stdoutSink, stderr.writable);

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
  // A sandbox that died under the exec (under gVisor, an OOM kill takes it whole) ends it: the engine
  // may never end its stream, and no process is left to wait for.
  // The engine's events arrive late: a `die` of a restart made before this exec began can come while it
  // runs. Only a sandbox that is not running now ends it.
  let offDie: (() => void) | undefined;
  const died = new Promise<'died'>((resolve) => {
    offDie = target.onDie?.(() => {
      void dockerCall('inspect container', { timeoutMs: target.callTimeoutMs }, (abortSignal) => target.container.inspect({ abortSignal } as Parameters<Docker.Container['inspect']>[0]))
        .then((info) => { if (!info.State.Running) resolve('died'); }, () => resolve('died'));
    });
  });
  const first = await Promise.race([ended.then(() => 'ended' as const), stopped, died]).finally(() => offDie?.());
  if (first === 'died') stream.destroy();
  const aborted = first === 'stopped' && opts.signal?.aborted === true;
  const timedOut = first === 'stopped' && !aborted;
  if (first === 'stopped') {
    await stopProcesses(target, ended, opts.user);
    stream.destroy();
  }
  let exitCode: number | null = null;
  try {
    const info = await dockerCall('inspect exec', { timeoutMs: target.callTimeoutMs }, (abortSignal) =>
      exec.inspect({ abortSignal } as object) as Promise<Docker.ExecInspectInfo>,
    );
    exitCode = info.ExitCode ?? null;
  } catch (err) {
    if (first === 'ended') throw err;
  }
  return {
    exitCode,
    ...(first === 'died' && { sandboxStopped: true as const }),
    timedOut,
    aborted,
    stdout: stdout.result(),
    stderr: stderr.result(),
    durationMs: Math.round(performance.now() - started),
  };
}

/**
 * Start `sh -c command` as SANDBOX_USER in the background (a helper the agent uses, such as the
 * model forwarder) and return once it prints its first line on stdout (it is ready). It is not the
 * agent's process, so the agent's exit code stays its own; it stops with the sandbox user's other
 * processes. Rejects, with what it wrote on stderr, when it exits first or is not ready in `timeoutMs`.
 */
export async function startBackgroundIn(
  target: ExecTarget,
  command: string,
  opts: { timeoutMs: number; env?: Record<string, string>; user?: string; signal?: AbortSignal },
): Promise<void> {
  const { stream } = await startExec(target, command, opts);
  const stdout = new OutputCapture(1024);
  const stderr = new OutputCapture(4096);
  const ready = new Promise<boolean>((resolve) => {
    const check = new Writable({
      write(chunk: Buffer, _enc, cb) {
        if (chunk.includes(0x0a)) resolve(true);
        stdout.writable.write(chunk, cb);
      },
    });
    target.docker.modem.demuxStream(stream, check, stderr.writable);
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

/** Create and start `sh -c command` (or the argv `command`, run as it is) as SANDBOX_USER, attached to its stdout and stderr. */
async function startExec(
  target: ExecTarget,
  command: string | readonly string[],
  opts: { workdir?: string | undefined; env?: Record<string, string> | undefined; user?: string | undefined; signal?: AbortSignal | undefined; stdin?: Buffer | undefined },
) {
  const stdin = opts.stdin !== undefined;
  const call = { timeoutMs: target.callTimeoutMs, signal: opts.signal };
  const exec = await dockerCall('create exec', call, (abortSignal) =>
    target.container.exec({
      Cmd: typeof command === 'string' ? [...(target.shell ?? ['sh', '-c']), command] : [...command],
      AttachStdout: true,
      AttachStderr: true,
      AttachStdin: stdin,
      Tty: false,
      User: opts.user ?? target.user ?? SANDBOX_USER_SPEC,
      WorkingDir: opts.workdir ?? target.workdir,
      Env: Object.entries(opts.env ?? {}).map(([k, v]) => `${k}=${v}`),
      abortSignal,
    } as Docker.ExecCreateOptions & { abortSignal: AbortSignal }),
  );
  const stream = (await dockerCall('start exec', call, (abortSignal) =>
    exec.start({ hijack: true, stdin, abortSignal } as Docker.ExecStartOptions),
  )) as NodeJS.ReadWriteStream & Readable;
  return { exec, stream };
}

/** TERM every process of the sandbox user, then KILL what is left after a grace period. */
async function stopProcesses(target: ExecTarget, ended: Promise<void>, user: string | undefined): Promise<void> {
  for (const sig of ['TERM', 'KILL'] as const) {
    await signalAll(target, sig, user);
    const grace = new Promise<'grace'>((resolve) => setTimeout(resolve, KILL_GRACE_MS, 'grace').unref());
    if ((await Promise.race([ended.then(() => 'ended' as const), grace])) === 'ended') return;
  }
  target.log.warn({ containerId: target.containerId }, 'process tree still attached after KILL');
}

async function signalAll(target: ExecTarget, sig: 'TERM' | 'KILL', user: string | undefined, signal?: AbortSignal): Promise<void> {
  const call = { timeoutMs: target.callTimeoutMs, signal };
  try {
    const exec = await dockerCall('create kill exec', call, (abortSignal) =>
      target.container.exec({ Cmd: ['kill', `-${sig}`, '-1'], User: user ?? target.user ?? SANDBOX_USER_SPEC, AttachStdout: true, AttachStderr: true, abortSignal } as never),
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
    target.log.warn({ containerId: target.containerId, err: dockerError('kill', err).message }, 'signalling the sandbox failed');
  }
}
