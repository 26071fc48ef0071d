// The end of the agent's turn, inside the sandbox, as ONE exec (run by end-of-turn.ts), by the runtime
// generation's own node, so nothing of the image's PATH runs here: for the fleet's own tasks the
// image's /bin/sh has already killed every process of the sandbox user with builtins only (sweep.ts)
// and then exec'd this program, so nothing of the agent's is left to run; for a Harbor task this
// program is the exec, as root, in a sandbox the engine restarted or with the agent's processes kept
// (as Harbor keeps them). In order, each step reported as a frame on stdout (frames.ts):
//   1. for a reward-file task, /logs/verifier made an empty real folder (or: it needs root);
//   2. the workspace as the agent left it, as a tar (entries named as the engine's getArchive names
//      them), capped; a file it cannot read makes the copy not whole (the worker asks the engine);
//   3. /tests emptied of whatever the agent left in it (or removed whole and made again), and the
//      hidden tests unpacked from stdin (8-byte length, then the parts' tars, each 8-byte length and
//      tar, a later part's files over an earlier's), never through a link and never outside /tests;
//   4. the verifier (`shell command` in the workdir), its stdout and stderr as frames, and then this
//      process exits with the verifier's exit code (128 + the signal that killed it);
//   5. for a reward-file task, the reward files it left, read without following links, and /logs as a
//      tar (capped as the workspace copy is), the evidence close would otherwise ask the engine for.
// A failure before the verifier starts is a frame `F` and exit code 70.
import { spawn } from 'node:child_process';
import { constants as fsConstants } from 'node:fs';
import { chmod, chown, lchown, lstat, mkdir, open, readdir, readFile, readlink, rename, rm, stat, symlink, link, utimes } from 'node:fs/promises';
import { constants as osConstants } from 'node:os';
import { posix } from 'node:path';
import { FRAME, MAX_FRAME_BYTES, encodeFrame, jsonFrame, type FrameType } from './frames.ts';
import { MAX_USTAR_SIZE, TAR_END, dataPadding, readTar, tarHeader } from './mini-tar.ts';

export interface EndOfTurnConfig {
  workdir: string;
  /** The workspace copy is not whole past this many bytes of tar; null: no copy is taken. */
  copyCapBytes: number | null;
  /** The same for the copy of /logs after the verifier of a reward-file task. */
  logsCapBytes: number | null;
  testsDir: string;
  /**
   * 'empty': the tests folder is this user's, emptied of what the agent left (the fleet's tasks);
   * 'replace': removed whole, whatever it is, and made again (Harbor's `rm -rf /tests`, as root).
   */
  testsFolder: 'empty' | 'replace';
  /** Files of the tests folder made executable once unpacked (Harbor's `chmod +x /tests/test.sh`). */
  executable: string[];
  /** The mode /logs/verifier is made with for a reward-file task (0777: any verifier user writes there). */
  logsMode: number;
  /** /logs made root's 0755 first (as root, with the agent's processes kept). */
  lockLogs: boolean;
  /**
   * The fleet's own helpers left running (the phases' forwarders), named by an argument of theirs:
   * killed first, as root, where the agent's processes are kept (their ports close before grading).
   */
  stopHelpers: string[];
  /** List the processes left beside the grader (all but this one and PID 1) in a frame, before anything else. */
  listBeside: boolean;
  /**
   * This program ran with NODE_OPTIONS emptied (an image's could stop it from starting): the
   * verifier gets it back, this value, or with none the one the sandbox's PID 1 has (the image's).
   * Undefined: the verifier keeps this program's environment as it is.
   */
  verifierNodeOptions?: { value?: string };
  command: string;
  shell: string[];
  /** A reward-file task: /logs/verifier made afresh before, its reward files and /logs read after. */
  rewardFile: boolean;
}

const FAILED_EXIT = 70;
/** After the verifier exits, its output pipes get this long to drain (a daemon it left may hold them open). */
const DRAIN_MS = 2_000;
const REWARD_CAP = 64 * 1024;
const REWARD_FILES = { json: '/logs/verifier/reward.json', txt: '/logs/verifier/reward.txt' } as const;

async function write(buf: Buffer): Promise<void> {
  if (process.stdout.write(buf)) return;
  await new Promise<void>((resolve) => process.stdout.once('drain', resolve));
}

async function writeChunks(type: FrameType, data: Buffer): Promise<void> {
  for (let at = 0; at < data.length; at += MAX_FRAME_BYTES) await write(encodeFrame(type, data.subarray(at, at + MAX_FRAME_BYTES)));
}

const errText = (err: unknown) => (err instanceof Error ? err.message : String(err));
const errCode = (err: unknown) => (err as NodeJS.ErrnoException | undefined)?.code;

/** KILL every process with one of `args` among its arguments, and wait (1 s at most) until none is left. */
async function stopHelpers(args: readonly string[]): Promise<void> {
  const matching = async (): Promise<number[]> => {
    const pids: number[] = [];
    for (const name of await readdir('/proc').catch(() => [] as string[])) {
      if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
      const argv = (await readFile(`/proc/${name}/cmdline`).catch(() => Buffer.alloc(0))).toString('utf8').split('\0');
      if (argv.some((a) => args.includes(a))) pids.push(Number(name));
    }
    return pids;
  };
  // A SIGKILL'd process is gone within a few ms: looked for again soon, for at most about a second.
  for (let i = 0; i < 100; i++) {
    const pids = await matching();
    if (pids.length === 0) return;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // Gone already.
      }
    }
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/** The processes of the sandbox but this one and PID 1: pid, uid and command line (capped), at most `max`. */
async function besideProcesses(max = 100): Promise<{ processes: Array<{ pid: number; uid: number; cmd: string }>; more: number }> {
  const processes: Array<{ pid: number; uid: number; cmd: string }> = [];
  let more = 0;
  for (const name of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid || name === '1') continue;
    const status = await readFile(`/proc/${name}/status`, 'utf8').catch(() => undefined);
    if (status === undefined || /^State:\s+Z/m.test(status)) continue;
    if (processes.length >= max) {
      more += 1;
      continue;
    }
    const cmd = (await readFile(`/proc/${name}/cmdline`).catch(() => Buffer.alloc(0))).toString('utf8').split('\0').filter(Boolean).join(' ');
    processes.push({ pid: Number(name), uid: Number(/^Uid:\s+(\d+)/m.exec(status)?.[1] ?? -1), cmd: cmd.slice(0, 200) });
  }
  return { processes, more };
}

/** How many things this run moved out of the way: each gets a name of its own. */
let movedAway = 0;

/**
 * `target` removed, or, where removing cannot finish (a chain of folders deeper than a path can name),
 * moved whole out of the way (into /tmp, else /): true once nothing is at `target`. A folder that came
 * with the image (/logs/verifier of a prepared image) cannot be moved (overlayfs without redirect_dir
 * answers EXDEV), but what was made in it since can: each entry is moved out of it, then it goes.
 */
async function removeOrMoveAway(target: string, depth = 0): Promise<boolean> {
  await rm(target, { recursive: true, force: true }).catch(() => undefined);
  const gone = () => lstat(target).then(() => false, () => true);
  if (await gone()) return true;
  if (await moveAway(target)) return gone();
  if (depth < 2 && (await lstat(target).catch(() => undefined))?.isDirectory()) {
    // What is left in it, the removal above could not remove (a chain of folders too deep to name, a
    // second walk down it would only fail again): each entry is moved first, removed only if it cannot be.
    for (const name of await readdir(target).catch(() => [] as string[])) {
      const entry = posix.join(target, name);
      if (!(await moveAway(entry))) await removeOrMoveAway(entry, depth + 1);
    }
    await rm(target, { recursive: true, force: true }).catch(() => undefined);
  }
  return gone();
}

/** `target` renamed out of the way (into /tmp, else /), not followed if it is a link; whether it moved. */
async function moveAway(target: string): Promise<boolean> {
  for (const dir of ['/tmp', '/']) {
    if (await rename(target, posix.join(dir, `.rf-left-${process.pid}-${movedAway++}-${posix.basename(target)}`)).then(() => true, () => false)) return true;
  }
  return false;
}

/**
 * Owner rwx on every folder under `dir` (not following links): what the sandbox user made, it may then
 * remove. Root needs none of it, and must not chmod by path what processes of the agent's, kept running,
 * could swap for a link (nor pay a walk down a chain of thousands of folders for nothing).
 */
async function openUp(dir: string): Promise<void> {
  if (process.getuid!() === 0) return;
  await chmod(dir, 0o700).catch(() => undefined);
  for (const name of await readdir(dir).catch(() => [] as string[])) {
    const p = posix.join(dir, name);
    const st = await lstat(p).catch(() => undefined);
    if (st?.isDirectory()) await openUp(p);
  }
}

/** Empty `dir` (a real folder of this user's) of everything in it. */
async function empty(dir: string): Promise<void> {
  const st = await lstat(dir);
  if (!st.isDirectory()) throw new Error(`${dir} is not a folder`);
  if (st.uid !== process.getuid!()) throw new Error(`${dir} is not the sandbox user's (uid ${st.uid})`);
  await openUp(dir);
  for (const name of await readdir(dir)) await removeOrMoveAway(posix.join(dir, name));
  const left = await readdir(dir);
  if (left.length > 0) throw new Error(`${dir} could not be emptied (${left.length} entries left)`);
}

/** /logs/verifier as an empty real folder, made by the sandbox user; false when what is there needs root. */
async function resetVerifierLogs(mode: number, lockLogs: boolean): Promise<boolean> {
  let logs = await lstat('/logs').catch(() => undefined);
  if (logs !== undefined && !logs.isDirectory() && process.getuid!() === 0) {
    // /logs made a link (or a file) by a root agent: Harbor bind-mounts it, so there no agent can. It is
    // moved out of the way, not followed, and made again: the verifier's files and the evidence's copy
    // of /logs are then in a real folder of root's.
    if (await moveAway('/logs')) await mkdir('/logs', { mode: 0o755 }).catch(() => undefined);
    logs = await lstat('/logs').catch(() => undefined);
  }
  if (lockLogs && logs?.isDirectory()) {
    // Root's 0755 from here, before /logs/verifier is made: nothing another user left running can then
    // remove the verifier's folder or put its own in its place (its folders there stay its own).
    await chown('/logs', 0, 0);
    await chmod('/logs', 0o755);
  } else if (logs?.isDirectory() && logs.uid === process.getuid!()) await chmod('/logs', logs.mode | 0o700).catch(() => undefined);
  const v = await lstat('/logs/verifier').catch(() => undefined);
  if (lockLogs && v?.isDirectory()) {
    // And the folder itself root's 0700 before it is emptied: one that came with the image cannot be
    // moved away whole (EXDEV), and what the agent left running must not fill it as fast as it empties.
    // (/logs is root's now: nothing can put a link in its place between the lstat and these.)
    await lchown('/logs/verifier', 0, 0);
    await chmod('/logs/verifier', 0o700);
  }
  if (v !== undefined) {
    if (v.isDirectory() && v.uid === process.getuid!()) await openUp('/logs/verifier');
    await removeOrMoveAway('/logs/verifier');
  }
  await mkdir('/logs/verifier', { recursive: true }).then(() => chmod('/logs/verifier', mode)).catch(() => undefined);
  const now = await lstat('/logs/verifier').catch(() => undefined);
  return now !== undefined && now.isDirectory() && (await readdir('/logs/verifier').catch(() => ['?'])).length === 0;
}

/** The folder `workdir` as a tar on stdout, in frames of `type`; whether it came whole. Past `capBytes`
 * the copy is cut: the walk stops (a 16 GiB sparse file is not read at all) and the copy is not whole. */
async function copyFolder(workdir: string, capBytes: number, type: FrameType, first: readonly string[] = []): Promise<{ whole: boolean; bytes: number; why?: string }> {
  const parent = posix.dirname(workdir);
  const base = posix.basename(workdir);
  let bytes = 0;
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  const flush = async (): Promise<void> => {
    if (pendingBytes === 0) return;
    const chunk = Buffer.concat(pending, pendingBytes);
    pending = [];
    pendingBytes = 0;
    await writeChunks(type, chunk);
  };
  /** Bytes of the tar, batched into frames of up to MAX_FRAME_BYTES. */
  const out = async (chunk: Buffer): Promise<void> => {
    bytes += chunk.length;
    pending.push(chunk);
    pendingBytes += chunk.length;
    if (pendingBytes >= MAX_FRAME_BYTES) await flush();
  };
  const rank = (name: string) => (first.includes(name) ? first.indexOf(name) : first.length);
  /** An entry of `more` bytes (headers and data) would pass the cap: the copy is cut here. */
  const fits = (more: number): void => {
    if (bytes + more + TAR_END.length > capBytes) throw new Error(`the copy passed ${capBytes} bytes`);
  };
  const walk = async (rel: string): Promise<void> => {
    const abs = posix.join(parent, rel);
    const st = await lstat(abs);
    const common = { mode: st.mode & 0o7777, uid: st.uid, gid: st.gid, mtime: Math.floor(st.mtimeMs / 1000), size: 0 };
    if (st.isDirectory()) {
      const header = tarHeader({ ...common, name: `${rel}/`, type: 'directory' });
      fits(header.length);
      await out(header);
      // The folder's own entries named in `first` before the rest (what must survive a cap on the way in).
      const names = (await readdir(abs)).sort((a, b) => (rel === base ? rank(a) - rank(b) : 0) || (a < b ? -1 : a > b ? 1 : 0));
      for (const name of names) await walk(posix.join(rel, name));
    } else if (st.isSymbolicLink()) {
      const header = tarHeader({ ...common, name: rel, type: 'symlink', linkname: await readlink(abs) });
      fits(header.length);
      await out(header);
    } else if (st.isFile()) {
      if (st.size > MAX_USTAR_SIZE) throw new Error(`${rel} is ${st.size} bytes`);
      const header = tarHeader({ ...common, name: rel, type: 'file', size: st.size });
      fits(header.length + st.size + dataPadding(st.size).length);
      const fh = await open(abs, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW);
      try {
        await out(header);
        let left = st.size;
        while (left > 0) {
          const buf = Buffer.allocUnsafe(Math.min(256 * 1024, left));
          const { bytesRead } = await fh.read(buf, 0, buf.length, null);
          if (bytesRead === 0) throw new Error(`${abs} shrank while it was read`);
          left -= bytesRead;
          await out(buf.subarray(0, bytesRead));
        }
        await out(dataPadding(st.size));
      } finally {
        await fh.close();
      }
    }
    // Sockets, FIFOs and devices are not workspace content: left out, as the evidence extraction would.
  };
  try {
    await walk(base);
    await out(TAR_END);
    await flush();
    return { whole: true, bytes };
  } catch (err) {
    // What was written of it is not a copy: the worker drops it and asks the engine at close (so what is
    // still pending is not sent).
    return { whole: false, bytes, why: errText(err) };
  }
}

const copyOrWhy = (dir: string, cap: number, type: FrameType, first: readonly string[] = []) =>
  copyFolder(dir, cap, type, first).catch((err: unknown) => ({ whole: false, bytes: 0, why: errText(err) }));

/** The payload on stdin: an 8-byte big-endian length, then that many bytes (stdin need not end). */
async function readPayload(): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let got = 0;
  let want: number | undefined;
  for await (const chunk of process.stdin as AsyncIterable<Buffer>) {
    chunks.push(chunk);
    got += chunk.length;
    if (want === undefined && got >= 8) want = 8 + Number(Buffer.concat(chunks).readBigUInt64BE(0));
    if (want !== undefined && got >= want) break;
  }
  const all = Buffer.concat(chunks);
  if (want === undefined || all.length < want) throw new Error(`stdin ended after ${all.length} bytes of ${want ?? 'a length'}`);
  return all.subarray(8, want);
}

/** The parts in a payload: each an 8-byte big-endian length, then that many bytes. */
function splitParts(payload: Buffer): Buffer[] {
  const parts: Buffer[] = [];
  for (let at = 0; at < payload.length;) {
    if (payload.length - at < 8) throw new Error(`the tests payload ends inside a part's length (at byte ${at})`);
    const end = at + 8 + Number(payload.readBigUInt64BE(at));
    if (end > payload.length) throw new Error(`a tests part of ${end - at - 8} bytes passes the payload's end`);
    parts.push(payload.subarray(at + 8, end));
    at = end;
  }
  return parts;
}

/**
 * The tests from their tars (entries under `tests/`, a later tar's files over an earlier's) into
 * `dir`, which is empty: no entry goes through a link or out of it.
 */
async function unpackTests(tars: readonly Buffer[], dir: string): Promise<void> {
  const top = posix.basename(dir);
  const dirModes: Array<[string, number, Date]> = [];
  const made = new Set<string>(['']);
  const within = (name: string): string => {
    const norm = posix.normalize(name.replace(/^\.\//, '')).replace(/\/+$/, '');
    if (norm !== top && !norm.startsWith(`${top}/`)) throw new Error(`tests entry ${JSON.stringify(name)} is outside ${top}/`);
    const rel = norm === top ? '' : norm.slice(top.length + 1);
    if (rel.split('/').includes('..') || posix.isAbsolute(rel)) throw new Error(`tests entry ${JSON.stringify(name)} leaves ${top}/`);
    return rel;
  };
  // Every folder on the way is one this unpacking made (so a real folder, never a link it unpacked).
  const parentsOf = async (rel: string) => {
    const parts = rel.split('/').slice(0, -1);
    for (let i = 1; i <= parts.length; i++) {
      const sub = parts.slice(0, i).join('/');
      if (made.has(sub)) continue;
      const st = await lstat(posix.join(dir, sub)).catch(() => undefined);
      if (st !== undefined) throw new Error(`tests entry ${JSON.stringify(rel)} would go through ${sub}, which is not a folder of the tests`);
      await mkdir(posix.join(dir, sub), { mode: 0o755 });
      made.add(sub);
    }
  };
  for (const { header: h, data } of tars.flatMap((t) => readTar(t))) {
    const rel = within(h.name);
    const target = rel === '' ? dir : posix.join(dir, rel);
    const mode = h.mode & 0o777;
    const mtime = new Date(h.mtime * 1000);
    if (h.type === 'directory') {
      if (rel !== '') {
        await parentsOf(rel);
        if (!made.has(rel)) {
          await mkdir(target, { mode: 0o755 });
          made.add(rel);
        }
      }
      dirModes.push([target, h.mode & 0o777, mtime]);
    } else if (h.type === 'file') {
      if (rel === '') throw new Error('the tests folder itself is a file in the tests tar');
      await parentsOf(rel);
      await rm(target, { force: true, recursive: true });
      const fh = await open(target, fsConstants.O_WRONLY | fsConstants.O_CREAT | fsConstants.O_EXCL | fsConstants.O_NOFOLLOW, 0o600);
      try {
        await fh.writeFile(data);
      } finally {
        await fh.close();
      }
      await chmod(target, mode);
      await utimes(target, mtime, mtime);
    } else if (h.type === 'symlink') {
      if (rel === '') throw new Error('the tests folder itself is a link in the tests tar');
      await parentsOf(rel);
      await rm(target, { force: true, recursive: true });
      // A link is unpacked as a link: nothing is written through it (no later entry goes through it).
      await symlink(h.linkname ?? '', target);
    } else if (h.type === 'link') {
      await parentsOf(rel);
      const from = posix.join(dir, within(h.linkname ?? ''));
      const st = await lstat(from);
      if (!st.isFile()) throw new Error(`tests hard link ${JSON.stringify(h.name)} names no file of the tests`);
      await rm(target, { force: true, recursive: true });
      await link(from, target);
    }
  }
  for (const [target, mode, mtime] of dirModes.reverse()) {
    await chmod(target, mode);
    await utimes(target, mtime, mtime);
  }
}

/** A reward file, read without following a link: undefined when there is none; 'not-regular' when it is something else. */
async function readRewardFile(file: string): Promise<Buffer | 'not-regular' | undefined> {
  const st = await lstat(file).catch(() => undefined);
  if (st === undefined) return undefined;
  if (!st.isFile()) return 'not-regular';
  const fh = await open(file, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW);
  try {
    const buf = Buffer.alloc(REWARD_CAP + 1);
    let n = 0;
    while (n < buf.length) {
      const { bytesRead } = await fh.read(buf, n, buf.length - n, null);
      if (bytesRead === 0) break;
      n += bytesRead;
    }
    return buf.subarray(0, n);
  } finally {
    await fh.close();
  }
}

/** The verifier's environment: this program's, with NODE_OPTIONS as the verifier would have had it. */
async function verifierEnv(config: EndOfTurnConfig): Promise<NodeJS.ProcessEnv> {
  const restore = config.verifierNodeOptions;
  if (restore === undefined) return process.env;
  const env = { ...process.env };
  delete env.NODE_OPTIONS;
  const image = restore.value ?? (await readFile('/proc/1/environ').catch(() => Buffer.alloc(0))).toString('utf8')
    .split('\0').find((kv) => kv.startsWith('NODE_OPTIONS='))?.slice('NODE_OPTIONS='.length);
  if (image !== undefined) env.NODE_OPTIONS = image;
  return env;
}

async function runVerifier(config: EndOfTurnConfig): Promise<number> {
  await write(encodeFrame(FRAME.verifierStart));
  const [file, ...args] = config.shell;
  const child = spawn(file!, [...args, config.command], { cwd: config.workdir, env: await verifierEnv(config), stdio: ['ignore', 'pipe', 'pipe'] });
  // Frames of both streams go out in the order their chunks arrive, one write at a time.
  let writing = Promise.resolve();
  const forward = (type: FrameType) => (chunk: Buffer) => {
    writing = writing.then(() => writeChunks(type, chunk));
  };
  child.stdout.on('data', forward(FRAME.stdout));
  child.stderr.on('data', forward(FRAME.stderr));
  const drained = Promise.all([child.stdout, child.stderr].map((s) => new Promise<void>((resolve) => s.once('close', resolve))));
  const exited = await new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve, reject) => {
    child.once('error', reject);
    child.once('exit', (code, signal) => resolve({ code, signal }));
  });
  let bound: NodeJS.Timeout | undefined;
  await Promise.race([drained, new Promise<void>((resolve) => (bound = setTimeout(resolve, DRAIN_MS)))]);
  clearTimeout(bound);
  child.stdout.destroy();
  child.stderr.destroy();
  await writing;
  return exited.code ?? 128 + (exited.signal ? osConstants.signals[exited.signal] : 0);
}

async function main(): Promise<number> {
  const config = JSON.parse(Buffer.from(process.argv[2] ?? '', 'base64').toString('utf8')) as EndOfTurnConfig;
  // 0. The fleet's helpers the agent's phase left.
  if (config.stopHelpers.length > 0) await stopHelpers(config.stopHelpers);
  if (config.listBeside) await write(jsonFrame(FRAME.beside, await besideProcesses()));
  // 1. The verifier's log folder, before anything else: when it needs root, nothing has been done yet.
  if (config.rewardFile) {
    const ok = await resetVerifierLogs(config.logsMode, config.lockLogs);
    await write(jsonFrame(FRAME.logsReset, { ok }));
    if (!ok) return FAILED_EXIT;
  }
  // 2. The workspace as the agent left it.
  const cap = config.copyCapBytes;
  if (cap !== null) {
    await write(jsonFrame(FRAME.workspaceEnd, await copyOrWhy(config.workdir, cap, FRAME.workspace)));
  }
  // 3. The hidden tests.
  try {
    const tests = splitParts(await readPayload());
    if (config.testsFolder === 'empty') await empty(config.testsDir);
    else {
      if (!(await removeOrMoveAway(config.testsDir))) throw new Error(`${config.testsDir} could not be removed`);
      await mkdir(config.testsDir, { mode: 0o755 });
    }
    await unpackTests(tests, config.testsDir);
    // As `chmod +x`: every x bit added, the link followed.
    for (const name of config.executable) {
      const file = posix.join(config.testsDir, name);
      await chmod(file, ((await stat(file)).mode & 0o7777) | 0o111);
    }
    await write(jsonFrame(FRAME.testsIn, { ok: true }));
  } catch (err) {
    await write(jsonFrame(FRAME.testsIn, { ok: false, why: errText(err), ...(errCode(err) !== undefined && { code: errCode(err) }) }));
    return FAILED_EXIT;
  }
  // 4. The verifier.
  const code = await runVerifier(config);
  // 5. Its reward files.
  if (config.rewardFile) {
    const json = await readRewardFile(REWARD_FILES.json).catch(() => 'not-regular' as const);
    const txt = json === undefined ? await readRewardFile(REWARD_FILES.txt).catch(() => 'not-regular' as const) : undefined;
    const notRegular = json === 'not-regular' ? 'reward.json' : txt === 'not-regular' ? 'reward.txt' : undefined;
    await write(jsonFrame(FRAME.reward, {
      ...(json instanceof Buffer && { json: json.toString('base64') }),
      ...(txt instanceof Buffer && { txt: txt.toString('base64') }),
      ...(notRegular !== undefined && { notRegular }),
    }));
    if (config.logsCapBytes !== null) await write(jsonFrame(FRAME.logsEnd, await copyOrWhy('/logs', config.logsCapBytes, FRAME.logs, ['verifier'])));
  }
  return code;
}

main().then(
  (code) => process.stdout.write(Buffer.alloc(0), () => process.exit(code)),
  (err: unknown) => {
    process.stdout.write(jsonFrame(FRAME.failed, { why: errText(err) }), () => process.exit(FAILED_EXIT));
  },
);
