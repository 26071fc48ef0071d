// The end of the agent's turn in ONE exec, the worker's side: the sweep (sh builtins of the image's
// /bin/sh), then the runtime generation's node running end-of-turn-main.ts, with the hidden tests on
// its stdin and a framed stream on its stdout: the workspace as the agent left it, the tests in, the
// verifier's output and exit code, its reward files. Where the separate steps took a sweep exec, a
// put of the tests, the verifier's exec (and for a reward-file task two execs more and a get), this is
// one exec. A Harbor task's sandbox is not swept (its agent may be root: the engine restarts it, or
// its processes are kept, as under Harbor): the program is the exec itself, run as root, with no
// shell of the image before it.
// The verifier's timeout starts when it does; the steps before it are bounded on their own.
import { FleetError } from '../../errors/fleet-error.ts';
import { OutputCapture } from '../captured-output.ts';
import { execIn, type ExecResult, type ExecTarget } from '../sandbox-exec.ts';
import { sweepThenExec } from '../sweep.ts';
import { FRAME, FrameReader } from './frames.ts';
import type { EndOfTurnConfig } from './end-of-turn-main.ts';

/** Where the program sits inside the runtime generation (sandbox-programs.ts bundles it there). */
export const END_OF_TURN_PATH = 'agent/end-of-turn.cjs';
/** The sweep, the copy and the tests' unpacking together get this long before the verifier starts. */
export const END_OF_TURN_PREPARE_MS = 30_000;

export interface EndOfTurnOptions {
  runtimeMountPath: string;
  workdir: string;
  /** The workspace copy is not whole past this many bytes of tar; null: no copy is taken. */
  copyCapBytes: number | null;
  /** The same for /logs, copied after the verifier of a reward-file task (undefined: none). */
  logsCapBytes?: number;
  testsDir: string;
  /** The tests' tars, entries under the tests folder's name (partAsTar), a later one's files over an earlier's. */
  tests: readonly Buffer[];
  command: string;
  rewardFile: boolean;
  /**
   * A Harbor task's end of the turn: no sweep (the engine restarted the sandbox, or the agent's
   * processes are kept, as Harbor keeps them), the program run as root with `env` (the verifier's),
   * /logs/verifier made with `logsMode`, /tests replaced whole, `executable` made so, the verifier
   * run by `shell`; the processes with an argument in `stopHelpers` (the fleet's forwarders) killed
   * first; with `lockLogs`, /logs made root's 0755 before /logs/verifier. Without it: the sweep, as the sandbox user, /logs/verifier 0777, /tests emptied,
   * `/bin/sh -c`.
   */
  asRoot?: {
    env: Record<string, string>; shell: readonly string[]; executable: readonly string[];
    logsMode: number; lockLogs?: boolean; stopHelpers?: readonly string[];
    /** The processes beside the grader listed (EndOfTurn's `beside`). */
    listBeside?: boolean;
  };
  verifierTimeoutMs: number;
  outputCapBytes: number;
  signal: AbortSignal;
  /** Called when the verifier starts. */
  onVerifierStart?: () => void;
}

/** A process that ran beside the grader, as /proc said (its command line capped at 200 characters). */
export interface BesideProcess { pid: number; uid: number; cmd: string }

/** The reward files as the verifier left them (read without following links). */
export interface RewardFiles {
  json?: Buffer;
  txt?: Buffer;
  /** The file that is there but is not a regular file. */
  notRegular?: string;
}

export type EndOfTurn =
  /** The sweep could not run, or processes kept coming: nothing else happened. */
  | { outcome: 'not-swept' }
  /** /logs/verifier holds what only root can remove: nothing else happened. */
  | { outcome: 'logs-need-root' }
  /** The tests could not be unpacked (`code`: the errno, e.g. ENOSPC). */
  | { outcome: 'tests-failed'; why: string; code?: string; workspaceTar?: Buffer }
  /** The program failed, or its stream broke, before the verifier started. */
  | { outcome: 'failed'; why: string; workspaceTar?: Buffer }
  | {
    outcome: 'verified'; workspaceTar?: Buffer; verifyRun: ExecResult; reward?: RewardFiles; logsTar?: Buffer; beside?: { processes: BesideProcess[]; more: number };
    /** The program ended (killed, or the sandbox stopped) after the verifier ran but before it read the reward files. */
    cutShort?: true;
  };

/** `data` after its length, 8 bytes big-endian. */
function lengthPrefixed(data: Buffer): Buffer {
  const length = Buffer.alloc(8);
  length.writeBigUInt64BE(BigInt(data.length));
  return Buffer.concat([length, data]);
}

/** The beside frame's list, each field checked (the program wrote it, but as root in the agent's sandbox). */
function besideOf(value: Record<string, unknown>): { processes: BesideProcess[]; more: number } {
  const list = Array.isArray(value.processes) ? value.processes as unknown[] : [];
  const processes = list.slice(0, 100).flatMap((p) => {
    const r = p as Record<string, unknown>;
    return typeof r.pid === 'number' && typeof r.uid === 'number' && typeof r.cmd === 'string' ? [{ pid: r.pid, uid: r.uid, cmd: r.cmd.slice(0, 200) }] : [];
  });
  return { processes, more: typeof value.more === 'number' ? value.more : 0 };
}

const decode = (payload: Buffer) => JSON.parse(payload.toString('utf8')) as Record<string, unknown>;

/** Run the end of the turn in `target` (the sandbox user's, with /bin/sh). */
export async function endOfTurn(target: ExecTarget, opts: EndOfTurnOptions): Promise<EndOfTurn> {
  const { asRoot } = opts;
  const config: EndOfTurnConfig = {
    workdir: opts.workdir, copyCapBytes: opts.copyCapBytes, logsCapBytes: opts.logsCapBytes ?? null, testsDir: opts.testsDir,
    testsFolder: asRoot ? 'replace' : 'empty', executable: [...(asRoot?.executable ?? [])], logsMode: asRoot?.logsMode ?? 0o777,
    stopHelpers: [...(asRoot?.stopHelpers ?? [])], lockLogs: asRoot?.lockLogs === true, listBeside: asRoot?.listBeside === true,
    ...(asRoot && { verifierNodeOptions: asRoot.env.NODE_OPTIONS !== undefined ? { value: asRoot.env.NODE_OPTIONS } : {} }),
    command: opts.command, shell: [...(asRoot?.shell ?? ['/bin/sh', '-c'])], rewardFile: opts.rewardFile,
  };
  const argv = [`${opts.runtimeMountPath}/bin/node.real`, `${opts.runtimeMountPath}/${END_OF_TURN_PATH}`, Buffer.from(JSON.stringify(config)).toString('base64')];
  const payload = lengthPrefixed(Buffer.concat(opts.tests.map(lengthPrefixed)));

  const workspace: Buffer[] = [];
  let workspaceWhole = false;
  const logs: Buffer[] = [];
  let logsWhole = false;
  let testsIn: Record<string, unknown> | undefined;
  let beside: { processes: BesideProcess[]; more: number } | undefined;
  let logsOk: boolean | undefined;
  let failed: string | undefined;
  let startedAt: number | undefined;
  let reward: RewardFiles | undefined;
  const stdout = new OutputCapture(opts.outputCapBytes);
  const stderr = new OutputCapture(opts.outputCapBytes);
  let late: string | undefined;

  const prepare = new AbortController();
  const verifierTimer = new AbortController();
  const prepareTimer = setTimeout(() => prepare.abort(), END_OF_TURN_PREPARE_MS);
  let verifierTimeout: NodeJS.Timeout | undefined;
  const reader = new FrameReader((type, payload) => {
    // Before the verifier starts nothing of the agent's or the verifier's runs: every frame is the
    // program's. After it, only output and the reward files are taken (nothing else is expected).
    if (startedAt === undefined) {
      if (type === FRAME.workspace) workspace.push(Buffer.from(payload));
      else if (type === FRAME.workspaceEnd) workspaceWhole = decode(payload).whole === true;
      else if (type === FRAME.logsReset) logsOk = decode(payload).ok === true;
      else if (type === FRAME.beside) beside = besideOf(decode(payload));
      else if (type === FRAME.testsIn) testsIn = decode(payload);
      else if (type === FRAME.failed) failed = String(decode(payload).why);
      else if (type === FRAME.verifierStart) {
        startedAt = performance.now();
        clearTimeout(prepareTimer);
        verifierTimeout = setTimeout(() => verifierTimer.abort(), opts.verifierTimeoutMs);
        opts.onVerifierStart?.();
      }
      return;
    }
    if (type === FRAME.stdout) stdout.writable.write(Buffer.from(payload));
    else if (type === FRAME.stderr) stderr.writable.write(Buffer.from(payload));
    else if (type === FRAME.reward && reward === undefined) {
      const r = decode(payload);
      reward = {
        ...(typeof r.json === 'string' && { json: Buffer.from(r.json, 'base64') }),
        ...(typeof r.txt === 'string' && { txt: Buffer.from(r.txt, 'base64') }),
        ...(typeof r.notRegular === 'string' && { notRegular: r.notRegular }),
      };
    } else if (type === FRAME.logs) logs.push(Buffer.from(payload));
    else if (type === FRAME.logsEnd) logsWhole = decode(payload).whole === true;
    else if (type === FRAME.failed) late ??= String(decode(payload).why);
  });

  let run: ExecResult;
  try {
    run = await execIn(asRoot ? target : { ...target, shell: ['/bin/sh', '-c'] }, asRoot ? argv : sweepThenExec(argv), {
      // The outer bound: the verifier's own timeout is armed when it starts.
      timeoutMs: END_OF_TURN_PREPARE_MS + opts.verifierTimeoutMs + 10_000,
      capBytes: 1024,
      workdir: '/',
      // The runtime's node takes no NODE_OPTIONS of the image's or the verifier's (an option of another
      // node would stop it); the verifier gets them back.
      ...(asRoot && { user: '0', env: { ...asRoot.env, NODE_OPTIONS: '' } }),
      stdin: payload,
      signal: AbortSignal.any([opts.signal, prepare.signal, verifierTimer.signal]),
      onStdout: (chunk) => reader.push(chunk),
    });
  } catch (err) {
    // The exec could not start (no pid left, the sandbox stopped): as a sweep that could not run.
    if (opts.signal.aborted) throw err;
    return { outcome: 'not-swept' };
  } finally {
    clearTimeout(prepareTimer);
    clearTimeout(verifierTimeout);
  }
  opts.signal.throwIfAborted();
  const workspaceTar = workspaceWhole ? Buffer.concat(workspace) : undefined;
  const copied = workspaceTar !== undefined ? { workspaceTar } : {};
  if (startedAt === undefined) {
    if (!asRoot && run.exitCode === 3 && logsOk === undefined && testsIn === undefined && !workspaceWhole && workspace.length === 0) return { outcome: 'not-swept' };
    if (logsOk === false) return { outcome: 'logs-need-root' };
    if (testsIn !== undefined && testsIn.ok !== true) {
      return { outcome: 'tests-failed', why: String(testsIn.why), ...(typeof testsIn.code === 'string' && { code: testsIn.code }), ...copied };
    }
    const why = failed ?? reader.broken ?? (prepare.signal.aborted ? `the sweep, the copy and the tests took over ${END_OF_TURN_PREPARE_MS / 1000}s` : `it exited with ${run.exitCode}: ${run.stderr.text.slice(0, 300)}`);
    return { outcome: 'failed', why, ...copied };
  }
  if (reader.broken !== undefined) throw new FleetError('verifier_crashed', `the verifier's output stream broke (${reader.broken})`);
  if (late !== undefined) throw new FleetError('verifier_crashed', `the end of the turn failed after the verifier ran: ${late}`);
  const timedOut = verifierTimer.signal.aborted;
  const verifyRun: ExecResult = {
    exitCode: timedOut ? null : run.exitCode,
    ...(run.sandboxStopped && { sandboxStopped: true as const }),
    timedOut,
    aborted: false,
    stdout: stdout.result(),
    stderr: stderr.result(),
    durationMs: Math.round(performance.now() - startedAt),
  };
  // With reward files the program always sends their frame (empty when there are none) once the
  // verifier is done: none (and no timeout that stopped it) means it did not get that far.
  const cutShort = opts.rewardFile && reward === undefined && !timedOut;
  return { outcome: 'verified', verifyRun, ...copied, ...(reward !== undefined && { reward }), ...(logsWhole ? { logsTar: Buffer.concat(logs) } : {}), ...(beside && { beside }), ...(cutShort && { cutShort: true as const }) };
}
