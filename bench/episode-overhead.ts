// What the fleet adds to one trivial episode, measured against the same container work done directly
// with dockerode, in the same run: create (the fleet's hardening), start, put the workspace, exec the
// agent, put the tests, exec the verifier, get the workspace, remove. Then the Docker API calls of an
// episode by kind, fleet and direct, counted by a small proxy in front of the engine's socket.
//
// Settings are WxC: W worker processes (the compiled CLI) at concurrency C each, against the direct
// sequence at concurrency W*C. Each setting runs R rounds; a round is one block of episodes each side,
// direct then fleet or fleet then direct (alternating), so both meet the same load on a shared host.
// Printed: enqueue -> last result, summed over rounds, episodes/s, the ratio fleet time / direct time
// (lower is better), the throughput ratio, each round's ratio, and the episodes' own phase timings
// (result.timings, every numeric field present; setupMs runs from pick-up to the workspace copied in,
// so it is claim -> first agent exec, less the exec's own start), and the host CPU per episode of each
// side (every process of the machine, from /proc/stat: saturated, the two cores are the limit, so this
// is what sets throughput; the fleet's from enqueue to every sandbox removed, with the workers' own and
// this bench's polls apart). Timed runs talk to the engine directly; only the call count goes through
// the counting proxy (which adds a hop).
//
// --task harbor: the same measured on a Harbor task in a built image (task.toml, environment/Dockerfile
// FROM the ubuntu:24.04 stand-in, tests/test.sh writing /logs/verifier/reward.txt), the agent the same
// command in /app. Its direct sequence is what a careful user of the built image writes by hand:
// create, start, put /logs, exec the agent (bash -c), put the tests, exec test.sh into
// /logs/verifier, get reward.txt, remove (the bench builds the image itself from the same Dockerfile).
// --agent-processes: the Harbor batch's agentProcesses (unset: the fleet's default, keep).
//
// --latency N: N single episodes more, one at a time on an idle fleet (1 worker x 1) and an idle engine,
// alternating with the direct sequence: each one's time from enqueue to its result (a one-episode
// batch, enqueued through enqueueBatch) against the direct sequence's, p50 and p90 of each, and the
// ratio of the p50s. Before each, the bench waits until the previous episode's sandbox is removed and
// the worker's pool (with --pool) is full again: the latency a warm pool buys, not its throughput.
//
// Run: npm run build && npx tsx bench/episode-overhead.ts [--settings 1x1,1x2,1x4,2x8] [--episodes 12]
//   [--rounds 3] [--pool 0] [--settle-sec 0] [--count-episodes 8] [--count-setting 1x2] [--no-count] [--no-timing]
//   [--latency 0] [--task own|harbor] [--agent-processes keep|stop] [--worker-prof DIR]
// --worker-prof DIR: each worker process writes a V8 CPU profile into DIR when it stops.
// --episodes N: episodes per setting and side, split over the rounds (each round at least 2 x the
// setting's total concurrency); --pool N: passed to every worker as FLEET_SANDBOX_POOL (warm containers
// per image per worker; 0 = off); --settle-sec: pause after the warm-up wave and after each fleet block
// (lets a pool refill; default 3 with a pool, else 0). Default run: about 4 minutes.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Readable, Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import type Docker from 'dockerode';
import { FlowProducer, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { EPISODES_QUEUE } from '../queues/episodes/contract.ts';
import { tarBuffer } from '../src/archive/tar-buffer.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { enqueueBatch } from '../src/producer/enqueue-batch.ts';
import { batchResultsKey } from '../src/redis/redis-keys.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { LABEL } from '../src/sandbox/labels.ts';
import { loadBatch } from '../src/tasks/load-task.ts';
import { poll, writeCommandBatch } from './command-batch.ts';

/** The compiled CLI (`npm run build`), as workers run it. */
const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));
const IMAGE = 'rollout-fleet/sandbox:busybox';
const AGENT_COMMAND = 'echo fixed > state.txt';
/** As bench/command-batch.ts writes the task. */
const WORKDIR = '/workspace';
const VERIFY_COMMAND = 'sh /tests/test.sh';
const LIMITS = { memoryMb: 128, cpus: 0.5, pids: 64, diskMb: 2048 };
/** Its own prefix: a reaper of another bench's fleet on the same engine must not take these sandboxes for orphans (nor ours theirs). */
const PREFIX = 'bench-ovh';
const BENCH_LABEL = 'rollout-fleet.bench';
const ENGINE_SOCKET = '/var/run/docker.sock';

const { values } = parseArgs({
  options: {
    settings: { type: 'string', default: '1x1,1x2,1x4,2x8' },
    episodes: { type: 'string', default: '12' },
    rounds: { type: 'string', default: '3' },
    pool: { type: 'string', default: '0' },
    'settle-sec': { type: 'string' },
    'count-episodes': { type: 'string', default: '8' },
    'count-setting': { type: 'string', default: '1x2' },
    'no-count': { type: 'boolean', default: false },
    'no-timing': { type: 'boolean', default: false },
    latency: { type: 'string', default: '0' },
    task: { type: 'string', default: 'own' },
    'worker-prof': { type: 'string' },
    'agent-processes': { type: 'string' },
  },
});
if (values.task !== 'own' && values.task !== 'harbor') throw new TypeError(`--task: expected own or harbor, got ${JSON.stringify(values.task)}`);
const HARBOR = values.task === 'harbor';

interface Setting { workers: number; concurrency: number; label: string }
function parseSetting(s: string): Setting {
  const m = /^(\d+)x(\d+)$/.exec(s.trim());
  if (!m || Number(m[1]) < 1 || Number(m[2]) < 1) throw new TypeError(`a setting is WORKERSxCONCURRENCY (e.g. 2x8), got ${JSON.stringify(s)}`);
  return { workers: Number(m[1]), concurrency: Number(m[2]), label: `${m[1]}x${m[2]}` };
}
const settings = values.settings.split(',').filter((s) => s.trim() !== '').map(parseSetting);
const countSetting = parseSetting(values['count-setting']);
const episodesOpt = Number(values.episodes);
const rounds = Number(values.rounds);
const pool = Number(values.pool);
const countEpisodes = Number(values['count-episodes']);
const latencyEpisodes = Number(values.latency);
const settleSec = values['settle-sec'] === undefined ? (pool > 0 ? 3 : 0) : Number(values['settle-sec']);
for (const [name, n, min] of [['episodes', episodesOpt, 1], ['rounds', rounds, 1], ['pool', pool, 0], ['count-episodes', countEpisodes, 1], ['latency', latencyEpisodes, 0]] as const) {
  if (!Number.isInteger(n) || n < min) throw new TypeError(`--${name}: expected an integer from ${min} up, got ${n}`);
}
if (!(settleSec >= 0)) throw new TypeError(`--settle-sec: expected a number from 0 up, got ${settleSec}`);

// ---------------------------------------------------------------------------------------------------
// Small statistics and printing helpers.

function quantile(xs: number[], q: number): number | undefined {
  if (xs.length === 0) return undefined;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}
const ms = (x: number | undefined) => (x === undefined ? '-' : x.toFixed(0));
const load = () => os.loadavg()[0]!.toFixed(1);

// Where the CPU goes: at saturation the two cores are the limit, so CPU per episode is what sets
// throughput. /proc/stat's busy time covers every process of the host (the engine, containerd, the
// shims and runc, the sandboxes, Redis, the workers, this bench); a process's own from its stat.
const CLOCK_TICK_MS = 10; // USER_HZ is 100 on Linux
async function hostBusyMs(): Promise<number> {
  const fields = (await readFile('/proc/stat', 'utf8')).split('\n', 1)[0]!.trim().split(/\s+/).slice(1).map(Number);
  const total = fields.reduce((a, b) => a + b, 0);
  return (total - fields[3]! - (fields[4] ?? 0)) * CLOCK_TICK_MS; // less idle and iowait
}
async function processCpuMs(pid: number): Promise<number> {
  const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
  const after = stat.slice(stat.lastIndexOf(')') + 2).split(' '); // field 3 (state) on
  return (Number(after[11] ?? 0) + Number(after[12] ?? 0)) * CLOCK_TICK_MS; // utime, stime
}
const benchCpuMs = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };
interface CpuUse { hostMs: number; workersMs: number; benchMs: number }
const out = (line = '') => process.stdout.write(`${line}\n`);

// ---------------------------------------------------------------------------------------------------
// The counting proxy: a Unix socket that pipes each connection to the engine and reads the HTTP request
// line of every request on it (keep-alive connections carry several: bodies are skipped by
// Content-Length or chunked framing). After a request that upgrades the connection (a hijacked exec
// start), the rest of it is a raw stream: not parsed. Latency = request's first byte to the response's
// first byte (clients do not pipeline, so a connection has at most one request waiting).

interface CallRecord { phase: string; kind: string; latencyMs?: number }

/** `METHOD /path?query-keys` with ids, names and the API version taken out. */
export function callKind(method: string, target: string): string {
  const q = target.indexOf('?');
  let p = q < 0 ? target : target.slice(0, q);
  const query = q < 0 ? '' : target.slice(q + 1);
  p = p.replace(/^\/v\d+(\.\d+)?(?=\/)/, '');
  const image = /^\/images\/(.+)\/(json|history|push|tag|get)$/.exec(p);
  if (image) p = `/images/{name}/${image[2]}`;
  else {
    p = p.replace(/^\/(containers|exec|volumes|networks|plugins)\/([^/]+)/, (all, res: string, id: string) =>
      (['json', 'create', 'prune'].includes(id) ? all : `/${res}/${res === 'volumes' ? '{name}' : '{id}'}`));
  }
  // dockerode sends every create option as a query key too: the path says enough.
  const keys = p.endsWith('/create') ? [] : [...new Set(new URLSearchParams(query).keys())].sort();
  return `${method} ${p}${keys.length > 0 ? `?${keys.join('&')}` : ''}`;
}

class RequestParser {
  private buf: Buffer = Buffer.alloc(0);
  private state: 'head' | 'body' | 'chunk-size' | 'chunk-data' | 'chunk-crlf' | 'trailer' | 'tunnel' = 'head';
  private remaining = 0;
  constructor(private readonly onRequest: (method: string, target: string) => void) {}

  push(chunk: Buffer): void {
    if (this.state === 'tunnel') return;
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    for (;;) {
      switch (this.state) {
        case 'tunnel':
          this.buf = Buffer.alloc(0);
          return;
        case 'head': {
          const end = this.buf.indexOf('\r\n\r\n');
          if (end < 0) {
            // Not HTTP as expected: stop reading this connection rather than guess.
            if (this.buf.length > 64 * 1024) this.state = 'tunnel';
            return;
          }
          const lines = this.buf.subarray(0, end).toString('latin1').split('\r\n');
          this.buf = this.buf.subarray(end + 4);
          const [method = '?', target = '?'] = lines[0]!.split(' ');
          const headers = new Map<string, string>();
          for (const line of lines.slice(1)) {
            const colon = line.indexOf(':');
            if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim().toLowerCase());
          }
          this.onRequest(method, target);
          if (headers.has('upgrade') || (headers.get('connection') ?? '').includes('upgrade')) {
            this.state = 'tunnel';
          } else if ((headers.get('transfer-encoding') ?? '').includes('chunked')) {
            this.state = 'chunk-size';
          } else {
            this.remaining = Number(headers.get('content-length') ?? 0) || 0;
            this.state = this.remaining > 0 ? 'body' : 'head';
          }
          break;
        }
        case 'body':
        case 'chunk-data': {
          const take = Math.min(this.remaining, this.buf.length);
          this.buf = this.buf.subarray(take);
          this.remaining -= take;
          if (this.remaining > 0) return;
          this.state = this.state === 'body' ? 'head' : 'chunk-crlf';
          break;
        }
        case 'chunk-crlf':
          if (this.buf.length < 2) return;
          this.buf = this.buf.subarray(2);
          this.state = 'chunk-size';
          break;
        case 'chunk-size': {
          const eol = this.buf.indexOf('\r\n');
          if (eol < 0) return;
          const size = parseInt(this.buf.subarray(0, eol).toString('latin1').split(';')[0]!, 16);
          this.buf = this.buf.subarray(eol + 2);
          if (!Number.isFinite(size)) this.state = 'tunnel';
          else if (size === 0) this.state = 'trailer';
          else {
            this.remaining = size;
            this.state = 'chunk-data';
          }
          break;
        }
        case 'trailer': {
          const eol = this.buf.indexOf('\r\n');
          if (eol < 0) return;
          const empty = eol === 0;
          this.buf = this.buf.subarray(eol + 2);
          if (empty) this.state = 'head';
          break;
        }
      }
    }
  }
}

interface CountingProxy {
  socketPath: string;
  records: CallRecord[];
  /** Requests from now on are recorded under this phase. */
  phase: string;
  close(): Promise<void>;
}

async function startCountingProxy(socketPath: string, target = ENGINE_SOCKET): Promise<CountingProxy> {
  await rm(socketPath, { force: true });
  const records: CallRecord[] = [];
  const sockets = new Set<net.Socket>();
  const proxy: CountingProxy = {
    socketPath,
    records,
    phase: 'idle',
    close: () => new Promise<void>((resolve) => {
      for (const s of sockets) s.destroy();
      server.close(() => resolve());
    }),
  };
  const server = net.createServer((client) => {
    const engine = net.connect(target);
    sockets.add(client);
    sockets.add(engine);
    const waiting: Array<{ record: CallRecord; t0: number }> = [];
    const parser = new RequestParser((method, path) => {
      const record: CallRecord = { phase: proxy.phase, kind: callKind(method, path) };
      records.push(record);
      waiting.push({ record, t0: performance.now() });
    });
    client.on('data', (chunk: Buffer) => parser.push(chunk));
    engine.on('data', () => {
      const w = waiting.shift();
      if (w) w.record.latencyMs = performance.now() - w.t0;
    });
    client.pipe(engine);
    engine.pipe(client);
    const end = () => {
      client.destroy();
      engine.destroy();
      sockets.delete(client);
      sockets.delete(engine);
    };
    client.on('error', end);
    engine.on('error', end);
    client.on('close', end);
    engine.on('close', end);
  });
  server.listen(socketPath);
  await once(server, 'listening');
  return proxy;
}

// ---------------------------------------------------------------------------------------------------
// The direct baseline: one trivial episode's container work with dockerode, nothing else.

const STEPS = ['create', 'start', 'put in', 'agent exec', 'put tests', 'verify exec', 'get out', 'remove'] as const;
type Step = (typeof STEPS)[number];
type StepTimes = Record<Step, number>;

/** One task's container work, done by hand: what goes in first (the workspace, or Harbor's /logs), the agent, the tests, the verifier, what comes out. */
interface Inputs {
  image: string;
  /** '' is the image's USER (a Harbor image's root). */
  user: string;
  workdir: string;
  shell: string[];
  capDrop: string[];
  putIn: Buffer;
  agentCommand: string;
  tests: Buffer;
  verifyCommand: string;
  /** The file that says the episode passed: the workspace (read whole), or the reward file. */
  getOut: string;
  passed: (verifierExit: number | null, out: Buffer) => boolean;
  storageOpt: Record<string, string> | undefined;
}

/** The Harbor task of --task harbor, written once per run (its image built from it by the fleet and, for the direct side, by the bench). */
const HARBOR_FILES = {
  'task.toml': 'version = "1.0"\n\n[verifier]\ntimeout_sec = 20.0\n\n[agent]\ntimeout_sec = 60.0\n\n[environment]\nbuild_timeout_sec = 300.0\n',
  'instruction.md': 'Write fixed into /app/state.txt.\n',
  'environment/Dockerfile': 'FROM ubuntu:24.04\nWORKDIR /app\nRUN echo broken > /app/state.txt\n',
  'tests/test.sh': '#!/bin/bash\nif grep -qx fixed /app/state.txt; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n',
} as const;

async function writeHarborBatch(dir: string, name: string, opts: { samples: number; command: string }): Promise<string> {
  const task = path.join(dir, 'harbor-tasks', 'fix');
  for (const [file, body] of Object.entries(HARBOR_FILES)) {
    await mkdir(path.dirname(path.join(task, file)), { recursive: true });
    await writeFile(path.join(task, file), body, { mode: file.endsWith('.sh') ? 0o755 : 0o644 });
  }
  const file = path.join(dir, `${name}.yaml`);
  await writeFile(file, `name: ${name}\ntasks: [${JSON.stringify(task)}]\nsamples: ${opts.samples}\nagent: { kind: command, command: ${JSON.stringify(opts.command)} }\n`
    + `${values['agent-processes'] === undefined ? '' : `agentProcesses: ${values['agent-processes']}\n`}defaults:\n  limits: { memoryMb: 128, cpus: 0.5, pids: 64 }\n`);
  return file;
}

async function buildInputs(docker: Docker, runId: string): Promise<Inputs> {
  const user = { mtime: new Date(0), uid: 1000, gid: 1000, uname: '', gname: '' };
  const root = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' };
  // The fleet asks for StorageOpt size and, on an engine that refuses it, stops asking: mirror the answer.
  let storageOpt: Record<string, string> | undefined = { size: `${LIMITS.diskMb}M` };
  try {
    const c = await docker.createContainer({ Image: IMAGE, Cmd: ['true'], Labels: { [BENCH_LABEL]: runId }, HostConfig: { StorageOpt: storageOpt } });
    await c.remove({ force: true });
  } catch {
    storageOpt = undefined;
  }
  if (HARBOR) {
    const image = `rollout-fleet/bench-harbor:${runId}`;
    const context = await tarBuffer((pack) => pack.entry({ ...root, name: 'Dockerfile', mode: 0o644 }, HARBOR_FILES['environment/Dockerfile']));
    const build = await docker.buildImage(Readable.from([context]), { t: image, labels: { [BENCH_LABEL]: runId } } as Docker.ImageBuildOptions);
    await new Promise<void>((resolve, reject) => docker.modem.followProgress(build, (err: Error | null, res: Array<{ error?: string }>) => {
      const failed = res?.find((r) => r.error !== undefined);
      if (err || failed) reject(err ?? new Error(`building ${image}: ${failed!.error}`));
      else resolve();
    }));
    const dirEntry = (name: string) => ({ ...root, name, type: 'directory' as const, mode: 0o777 });
    return {
      image, user: '', workdir: '/app', shell: ['bash', '-c'], capDrop: ['NET_RAW', 'MKNOD', 'AUDIT_WRITE', 'SETFCAP', 'SETPCAP', 'SYS_CHROOT'],
      putIn: await tarBuffer((pack) => { for (const d of ['logs/', 'logs/agent/', 'logs/verifier/', 'logs/artifacts/']) pack.entry(dirEntry(d)); }),
      agentCommand: AGENT_COMMAND,
      tests: await tarBuffer((pack) => {
        pack.entry({ ...root, name: 'tests/', type: 'directory', mode: 0o755 });
        pack.entry({ ...root, name: 'tests/test.sh', type: 'file', mode: 0o755 }, HARBOR_FILES['tests/test.sh']);
      }),
      verifyCommand: '(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1',
      getOut: '/logs/verifier/reward.txt',
      passed: (_exit, out) => out.includes(Buffer.from('1\n')),
      storageOpt,
    };
  }
  return {
    image: IMAGE, user: '1000:1000', workdir: WORKDIR, shell: ['sh', '-c'], capDrop: ['ALL'],
    putIn: await tarBuffer((pack) => {
      pack.entry({ ...user, name: 'workspace/', type: 'directory', mode: 0o755 });
      pack.entry({ ...user, name: 'workspace/state.txt', type: 'file', mode: 0o644 }, 'broken\n');
    }),
    agentCommand: AGENT_COMMAND,
    tests: await tarBuffer((pack) => {
      pack.entry({ ...root, name: 'tests/', type: 'directory', mode: 0o755 });
      pack.entry({ ...root, name: 'tests/test.sh', type: 'file', mode: 0o644 }, 'grep -qx fixed state.txt\n');
    }),
    verifyCommand: VERIFY_COMMAND,
    getOut: WORKDIR,
    passed: (exit) => exit === 0,
    storageOpt,
  };
}

async function execIn(docker: Docker, container: Docker.Container, inputs: Inputs, command: string, env: string[]): Promise<number | null> {
  const exec = await container.exec({
    Cmd: [...inputs.shell, command], AttachStdout: true, AttachStderr: true, AttachStdin: false, Tty: false,
    User: inputs.user, WorkingDir: inputs.workdir, Env: env,
  });
  const stream = (await exec.start({ hijack: true, stdin: false })) as NodeJS.ReadableStream;
  const sink = new Writable({ write: (_c, _e, cb) => cb() });
  docker.modem.demuxStream(stream, sink, sink);
  await new Promise<void>((resolve) => {
    stream.once('end', resolve);
    stream.once('close', resolve);
    stream.once('error', () => resolve());
  });
  const info = await exec.inspect();
  return info.ExitCode ?? null;
}

async function directEpisode(docker: Docker, inputs: Inputs, runId: string, n: number): Promise<StepTimes> {
  const t = Object.fromEntries(STEPS.map((s) => [s, 0])) as StepTimes;
  const step = async <T>(name: Step, fn: () => Promise<T>): Promise<T> => {
    const s = performance.now();
    try {
      return await fn();
    } finally {
      t[name] += performance.now() - s;
    }
  };
  const memory = LIMITS.memoryMb * 1024 * 1024;
  const container = await step('create', () => docker.createContainer({
    name: `rf-direct-${runId}-${n}-${randomBytes(3).toString('hex')}`,
    Image: inputs.image,
    Cmd: ['sleep', '2147483647'],
    User: '0:0',
    WorkingDir: inputs.workdir,
    Env: ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin', 'HOME=/tmp'],
    Labels: { [BENCH_LABEL]: runId },
    NetworkDisabled: true,
    HostConfig: {
      NetworkMode: 'none', CapDrop: inputs.capDrop, SecurityOpt: ['no-new-privileges'],
      Memory: memory, MemorySwap: memory, NanoCpus: Math.round(LIMITS.cpus * 1e9), PidsLimit: LIMITS.pids, Init: true,
      ...(inputs.storageOpt && { StorageOpt: inputs.storageOpt }),
      AutoRemove: false,
    },
  }));
  try {
    await step('start', () => container.start());
    await step('put in', () => container.putArchive(inputs.putIn, { path: '/' }));
    const env = ['TASK_ID=fix', 'TASK_INSTRUCTION=write fixed into state.txt'];
    const agent = await step('agent exec', () => execIn(docker, container, inputs, inputs.agentCommand, env));
    if (agent !== 0) throw new Error(`direct: agent exited ${agent}`);
    await step('put tests', () => container.putArchive(inputs.tests, { path: '/' }));
    const verifier = await step('verify exec', () => execIn(docker, container, inputs, inputs.verifyCommand, []));
    const got = await step('get out', async () => {
      const tar = (await container.getArchive({ path: inputs.getOut })) as NodeJS.ReadableStream;
      const chunks: Buffer[] = [];
      for await (const chunk of tar) chunks.push(chunk as Buffer); // read to the end, as the fleet's snapshot does
      return Buffer.concat(chunks);
    });
    if (!inputs.passed(verifier, got)) throw new Error(`direct: the episode did not pass (verifier exited ${verifier}): the agent's write did not land`);
  } finally {
    await step('remove', () => container.remove({ force: true, v: true }));
  }
  return t;
}

interface DirectRun { seconds: number; perSec: number; steps: StepTimes[]; episodeMs: number[] }

async function runDirect(docker: Docker, inputs: Inputs, runId: string, episodes: number, concurrency: number): Promise<DirectRun> {
  let next = 0;
  const steps: StepTimes[] = [];
  const episodeMs: number[] = [];
  const started = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < episodes) {
      const n = next++;
      const s = performance.now();
      steps.push(await directEpisode(docker, inputs, runId, n));
      episodeMs.push(performance.now() - s);
    }
  }));
  const seconds = (performance.now() - started) / 1000;
  return { seconds, perSec: episodes / seconds, steps, episodeMs };
}

// ---------------------------------------------------------------------------------------------------
// The fleet: worker processes from the compiled CLI on a private Redis.

interface FleetRun { seconds: number; perSec: number; removedSeconds: number; timings: Record<string, number[]>; queueWaitMs: number[] }

interface FleetEnv {
  redisUrl: string;
  client: Redis;
  dir: string;
  queue: Queue;
  flows: FlowProducer;
  results: ResultsStore;
  docker: Docker;
}

class Workers {
  private children: ChildProcess[] = [];
  constructor(private readonly env: FleetEnv) {}

  async start(setting: Setting, dockerHost: string, tag: string): Promise<void> {
    const env = {
      ...process.env, REDIS_URL: this.env.redisUrl, FLEET_PREFIX: PREFIX, FLEET_DATA_DIR: path.join(this.env.dir, 'data'),
      LOG_LEVEL: 'warn', DOCKER_HOST: dockerHost, FLEET_SANDBOX_POOL: String(pool),
    };
    for (let i = 0; i < setting.workers; i++) {
      const prof = values['worker-prof'] === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${values['worker-prof']}`];
      this.children.push(spawn(process.execPath, [...prof, BIN, 'worker', '--concurrency', String(setting.concurrency)], {
        env: { ...env, FLEET_WORKER_ID: `ovh-${tag}-${i}` }, stdio: ['ignore', 'ignore', 'inherit'],
      }));
    }
    await poll(`${setting.workers} workers to connect`, 60_000, async () => (await this.env.queue.getWorkers()).length >= setting.workers);
  }

  /** CPU used so far by the running worker processes, ms. */
  async cpuMs(): Promise<number> {
    const each = await Promise.all(this.children.map((c) => (c.pid === undefined ? 0 : processCpuMs(c.pid))));
    return each.reduce((a, b) => a + b, 0);
  }

  async stop(): Promise<void> {
    await Promise.all(this.children.splice(0).map(async (c) => {
      if (c.exitCode === null && c.signalCode === null) {
        c.kill('SIGTERM');
        await once(c, 'exit');
      }
    }));
    // A stopped worker's connections linger in CLIENT LIST for a moment: the next start must not count them.
    await poll('stopped workers to disconnect', 30_000, async () => (await this.env.queue.getWorkers()).length === 0);
  }
}

/** Enqueue `episodes` trivial episodes, wait for every result (polled every 10 ms) and every sandbox's removal. */
async function runFleetBatch(f: FleetEnv, name: string, episodes: number, pollMs = 10): Promise<FleetRun> {
  const file = await (HARBOR ? writeHarborBatch : writeCommandBatch)(f.dir, name, { samples: episodes, command: AGENT_COMMAND });
  const batch = await loadBatch(file);
  const started = performance.now();
  const startedAt = Date.now();
  const plan = await enqueueBatch(batch, { flows: f.flows, redis: f.client, prefix: PREFIX, results: f.results });
  await poll(`${episodes} results`, 600_000, async () => (await f.results.resultCount(plan.batchId)) >= episodes, pollMs);
  const seconds = (performance.now() - started) / 1000;
  // Done when no container of the batch is left (the cleanup queue's reaper is always scheduled, so its counts never reach 0).
  await poll('sandboxes to be removed', 120_000, async () =>
    (await f.docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } })).length === 0, 50);
  const removedSeconds = (performance.now() - started) / 1000;
  // Read raw: every timings field the worker wrote, also ones the result schema does not know yet.
  const raw = Object.values(await f.client.hgetall(batchResultsKey(PREFIX, plan.batchId))).map((v) => JSON.parse(v) as {
    status: string; timings?: Record<string, unknown>; startedAt?: string; error?: unknown;
  });
  const bad = raw.filter((r) => r.status !== 'passed');
  if (bad.length > 0) throw new Error(`${bad.length} fleet episodes did not pass: ${JSON.stringify(bad[0])}`);
  const timings: Record<string, number[]> = {};
  for (const r of raw) {
    for (const [k, v] of Object.entries(r.timings ?? {})) if (typeof v === 'number') (timings[k] ??= []).push(v);
  }
  const queueWaitMs = raw.flatMap((r) => (r.startedAt ? [Date.parse(r.startedAt) - startedAt] : []));
  return { seconds, perSec: episodes / seconds, removedSeconds, timings, queueWaitMs };
}

// ---------------------------------------------------------------------------------------------------

function mergeDirect(runs: DirectRun[]): DirectRun {
  const seconds = runs.reduce((a, r) => a + r.seconds, 0);
  const n = runs.reduce((a, r) => a + r.episodeMs.length, 0);
  return { seconds, perSec: n / seconds, steps: runs.flatMap((r) => r.steps), episodeMs: runs.flatMap((r) => r.episodeMs) };
}

function mergeFleet(runs: FleetRun[]): FleetRun {
  const seconds = runs.reduce((a, r) => a + r.seconds, 0);
  const n = runs.reduce((a, r) => a + r.perSec * r.seconds, 0);
  const timings: Record<string, number[]> = {};
  for (const r of runs) for (const [k, v] of Object.entries(r.timings)) (timings[k] ??= []).push(...v);
  return { seconds, perSec: n / seconds, removedSeconds: runs.reduce((a, r) => a + r.removedSeconds, 0), timings, queueWaitMs: runs.flatMap((r) => r.queueWaitMs) };
}

function describeDirect(d: DirectRun): string {
  const steps = STEPS.map((s) => `${s} ${ms(quantile(d.steps.map((t) => t[s]), 0.5))}`).join(', ');
  return `episode p50 ${ms(quantile(d.episodeMs, 0.5))} ms (p50 ms: ${steps})`;
}

function describeFleet(r: FleetRun): string {
  const order = ['setupMs', 'agentMs', 'verifyMs', 'closeMs', 'totalMs'];
  const keys = Object.keys(r.timings).sort((a, b) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99) || a.localeCompare(b));
  const phases = keys.map((k) => `${k} ${ms(quantile(r.timings[k]!, 0.5))}/${ms(quantile(r.timings[k]!, 0.9))}`).join(', ');
  return `timings p50/p90 ms: ${phases}`;
}

interface Row { setting: string; episodes: number; direct: DirectRun; fleet: FleetRun; timeRatio: number; rateRatio: number; load: string }

async function main(): Promise<void> {
  const realHost = process.env.DOCKER_HOST ?? `unix://${ENGINE_SOCKET}`;
  const docker = createDocker(realHost);
  await docker.getImage(IMAGE).inspect().catch(() => {
    throw new Error(`image ${IMAGE} not found: build it first (npm run setup)`);
  });
  const runId = randomBytes(4).toString('hex');
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench-ovh' });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-ovh-'));
  const f: FleetEnv = {
    redisUrl: redis.url, client, dir, docker,
    queue: new Queue(EPISODES_QUEUE, { connection: client, prefix: PREFIX }),
    flows: new FlowProducer({ connection: client, prefix: PREFIX }),
    results: new ResultsStore(client, PREFIX, path.join(dir, 'data')),
  };
  const workers = new Workers(f);
  let proxy: CountingProxy | undefined;
  const others = async () => (await docker.listContainers()).filter((c) => c.Labels?.[BENCH_LABEL] === undefined && c.Labels?.[LABEL.fleet] !== PREFIX).length;
  try {
    const inputs = await buildInputs(docker, runId);
    out(`bench: ${os.cpus().length} cores, load ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}, ${await others()} other running containers on the engine; `
      + `task ${HARBOR ? 'harbor (a built image)' : 'own'}, pool ${pool}, StorageOpt ${inputs.storageOpt ? 'accepted' : 'refused (the fleet watches the disk instead)'}`);
    const rows: Row[] = [];

    if (!values['no-timing']) {
      for (const setting of settings) {
        const slots = setting.workers * setting.concurrency;
        const perRound = Math.max(Math.ceil(episodesOpt / rounds), 2 * slots);
        const loadBefore = load();
        const directs: DirectRun[] = [];
        const fleets: FleetRun[] = [];
        const directCpu: CpuUse[] = [];
        const fleetCpu: CpuUse[] = [];
        // Warm-up (not timed): one wave each, so JIT, connections, the runtime generation and a pool are warm.
        await runDirect(docker, inputs, runId, slots, slots);
        await workers.start(setting, realHost, `${setting.label}-${runId}`);
        try {
          await runFleetBatch(f, `warm-${setting.label}-${runId}`, slots);
          if (settleSec > 0) await new Promise((r) => setTimeout(r, settleSec * 1000));
          // Short blocks, alternating which goes first: on a shared host both sides meet the same load.
          for (let round = 1; round <= rounds; round++) {
            const fleetRun = async () => {
              const c0 = { hostMs: await hostBusyMs(), workersMs: await workers.cpuMs(), benchMs: benchCpuMs() };
              fleets.push(await runFleetBatch(f, `ovh-${setting.label}-r${round}-${runId}`, perRound));
              fleetCpu.push({ hostMs: await hostBusyMs() - c0.hostMs, workersMs: await workers.cpuMs() - c0.workersMs, benchMs: benchCpuMs() - c0.benchMs });
              if (settleSec > 0) await new Promise((r) => setTimeout(r, settleSec * 1000));
            };
            const directRun = async () => {
              const c0 = { hostMs: await hostBusyMs(), benchMs: benchCpuMs() };
              directs.push(await runDirect(docker, inputs, runId, perRound, slots));
              directCpu.push({ hostMs: await hostBusyMs() - c0.hostMs, workersMs: 0, benchMs: benchCpuMs() - c0.benchMs });
            };
            for (const run of round % 2 === 1 ? [directRun, fleetRun] : [fleetRun, directRun]) await run();
          }
        } finally {
          await workers.stop();
        }
        const direct = mergeDirect(directs);
        const fleet = mergeFleet(fleets);
        const timeRatio = fleet.seconds / direct.seconds;
        const rateRatio = fleet.perSec / direct.perSec;
        const roundRatios = fleets.map((fr, i) => fr.seconds / directs[i]!.seconds);
        const episodes = perRound * rounds;
        const l = `${loadBefore}->${load()}`;
        rows.push({ setting: setting.label, episodes, direct, fleet, timeRatio, rateRatio, load: l });
        out(`\n${setting.label}: ${setting.workers} worker process(es) x concurrency ${setting.concurrency} vs direct at concurrency ${slots}, `
          + `${rounds} round(s) of ${perRound} episodes each side, load ${l}`);
        out(`  direct: ${direct.seconds.toFixed(2)} s, ${direct.perSec.toFixed(2)} episodes/s; ${describeDirect(direct)}`);
        out(`  fleet:  ${fleet.seconds.toFixed(2)} s enqueue -> last result (${fleet.removedSeconds.toFixed(2)} s to every sandbox removed), ${fleet.perSec.toFixed(2)} episodes/s; `
          + `enqueue -> first pick-up p50 ${ms(quantile(fleets.map((fr) => Math.min(...fr.queueWaitMs)), 0.5))} ms; ${describeFleet(fleet)}`);
        out(`  fleet/direct time ${timeRatio.toFixed(2)}x (lower is better), throughput ${rateRatio.toFixed(2)}x; per round: ${roundRatios.map((r) => `${r.toFixed(2)}x`).join(' ')}`);
        const perEpisode = (xs: CpuUse[], k: keyof CpuUse) => xs.reduce((a, c) => a + c[k], 0) / episodes;
        out(`  host CPU per episode (every process; fleet: enqueue -> every sandbox removed): direct ${ms(perEpisode(directCpu, 'hostMs'))} ms (this bench's dockerode ${ms(perEpisode(directCpu, 'benchMs'))}), `
          + `fleet ${ms(perEpisode(fleetCpu, 'hostMs'))} ms (the workers ${ms(perEpisode(fleetCpu, 'workersMs'))}, this bench's polls ${ms(perEpisode(fleetCpu, 'benchMs'))}); fleet / direct ${(perEpisode(fleetCpu, 'hostMs') / perEpisode(directCpu, 'hostMs')).toFixed(2)}x`);
      }
      out('\nsummary (fleet time / direct time, lower is better; throughput fleet / direct; times summed over rounds):');
      out('  setting  episodes  direct s  direct ep/s  fleet s  fleet ep/s  time ratio  throughput ratio  setup p50 ms  load');
      for (const r of rows) {
        out(`  ${r.setting.padEnd(7)}  ${String(r.episodes).padStart(8)}  ${r.direct.seconds.toFixed(2).padStart(8)}  ${r.direct.perSec.toFixed(2).padStart(11)}  `
          + `${r.fleet.seconds.toFixed(2).padStart(7)}  ${r.fleet.perSec.toFixed(2).padStart(10)}  ${`${r.timeRatio.toFixed(2)}x`.padStart(10)}  `
          + `${`${r.rateRatio.toFixed(2)}x`.padStart(16)}  ${ms(quantile(r.fleet.timings.setupMs ?? [], 0.5)).padStart(12)}  ${r.load}`);
      }
    }

    if (latencyEpisodes > 0) {
      const setting = parseSetting('1x1');
      await workers.start(setting, realHost, `lat-${runId}`);
      const directMs: number[] = [];
      const fleetMs: number[] = [];
      const setupMs: number[] = [];
      const totalMs: number[] = [];
      const pickUpMs: number[] = [];
      const fleetRuns: FleetRun[] = [];
      const loadBefore = load();
      try {
        // Idle: the last episode's sandbox removed, and the pool full again (all of the fleet's containers running, unclaimed).
        const idle = () => poll('an idle fleet', 60_000, async () => {
          const mine = await docker.listContainers({ all: true, filters: { label: [`${LABEL.fleet}=${PREFIX}`] } });
          return mine.length === pool && mine.every((c) => c.State === 'running' && c.Labels[LABEL.pool] !== undefined);
        }, 20);
        await runFleetBatch(f, `lat-warm-${runId}`, 1);
        await runDirect(docker, inputs, runId, 1, 1);
        for (let i = 0; i < latencyEpisodes; i++) {
          await idle();
          const fleetOne = async () => {
            const r = await runFleetBatch(f, `lat-${i}-${runId}`, 1, 2);
            fleetMs.push(r.seconds * 1000);
            setupMs.push(...(r.timings.setupMs ?? []));
            totalMs.push(...(r.timings.totalMs ?? []));
            pickUpMs.push(...r.queueWaitMs);
            fleetRuns.push(r);
          };
          const directOne = async () => {
            directMs.push(...(await runDirect(docker, inputs, runId, 1, 1)).episodeMs);
          };
          for (const run of i % 2 === 0 ? [fleetOne, directOne] : [directOne, fleetOne]) {
            await idle();
            await run();
          }
        }
      } finally {
        await workers.stop();
      }
      const [d50, f50] = [quantile(directMs, 0.5)!, quantile(fleetMs, 0.5)!];
      out(`\nlatency, one episode at a time on an idle fleet (1 worker x 1, pool ${pool}) and engine, ${latencyEpisodes} each side alternating, load ${loadBefore}->${load()}:`);
      out(`  direct: p50 ${ms(d50)} ms, p90 ${ms(quantile(directMs, 0.9))} ms`);
      out(`  fleet:  p50 ${ms(f50)} ms, p90 ${ms(quantile(fleetMs, 0.9))} ms enqueue -> result; set-up (pick-up -> workspace in, the agent's exec next) p50 ${ms(quantile(setupMs, 0.5))} ms, p90 ${ms(quantile(setupMs, 0.9))} ms`);
      out(`  fleet:  enqueue -> pick-up p50 ${ms(quantile(pickUpMs, 0.5))} ms; the episode (pick-up -> result built) p50 ${ms(quantile(totalMs, 0.5))} ms; the rest is recording the result and seeing it; ${describeFleet(mergeFleet(fleetRuns))}`);
      out(`  fleet/direct p50 ${(f50 / d50).toFixed(2)}x (lower is better)`);
    }

    if (!values['no-count']) {
      // Counted: the workers (DOCKER_HOST) and a direct client both go through the proxy; the bench's
      // own polls of the engine do not.
      proxy = await startCountingProxy(path.join(os.tmpdir(), `rf-calls-${process.pid}.sock`));
      const counted = createDocker(`unix://${proxy.socketPath}`);
      const slots = countSetting.workers * countSetting.concurrency;
      proxy.phase = 'worker start-up';
      await workers.start(countSetting, `unix://${proxy.socketPath}`, `count-${runId}`);
      try {
        proxy.phase = 'warm-up';
        await runFleetBatch(f, `count-warm-${runId}`, slots);
        proxy.phase = 'idle';
        await new Promise((r) => setTimeout(r, Math.max(1_000, settleSec * 1000)));
        proxy.phase = 'fleet';
        const fleetStarted = performance.now();
        await runFleetBatch(f, `count-${runId}`, countEpisodes);
        const fleetWindowSec = (performance.now() - fleetStarted) / 1000;
        proxy.phase = 'after';
        await workers.stop();
        proxy.phase = 'direct';
        await runDirect(counted, inputs, runId, countEpisodes, slots);
        proxy.phase = 'done';
        printCounts(proxy.records, countEpisodes, countSetting, fleetWindowSec);
      } finally {
        await workers.stop();
      }
    }
    out(`\nload at the end: ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}`);
  } finally {
    await workers.stop().catch(() => undefined);
    await proxy?.close();
    const left = await docker.listContainers({ all: true, filters: { label: [`${BENCH_LABEL}=${runId}`] } }).catch(() => []);
    await Promise.all(left.map((c) => docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined)));
    if (HARBOR) await docker.getImage(`rollout-fleet/bench-harbor:${runId}`).remove().catch(() => undefined);
    await f.queue.close();
    await f.flows.close();
    await client.quit();
    await redis.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

/** Calls the worker makes on a timer, whatever it runs: listed apart, never divided by episodes. */
const PERIODIC = new Set(['GET /images/json', 'GET /containers/json?all&filters', 'GET /info', 'GET /volumes/{name}', 'GET /volumes?filters', 'GET /_ping']);

function printCounts(records: CallRecord[], episodes: number, setting: Setting, windowSec: number): void {
  const byPhase = (phase: string) => {
    const m = new Map<string, { n: number; lat: number[] }>();
    for (const r of records) {
      if (r.phase !== phase) continue;
      const e = m.get(r.kind) ?? { n: 0, lat: [] };
      e.n += 1;
      if (r.latencyMs !== undefined) e.lat.push(r.latencyMs);
      m.set(r.kind, e);
    }
    return m;
  };
  const idle = byPhase('idle');
  const background = (kind: string) => PERIODIC.has(kind) || idle.has(kind);
  const fleet = byPhase('fleet');
  const direct = byPhase('direct');
  const kinds = [...new Set([...fleet.keys(), ...direct.keys()])].filter((k) => !background(k)).sort((a, b) => {
    const [ma, pa] = a.split(' ');
    const [mb, pb] = b.split(' ');
    return pa!.localeCompare(pb!) || ma!.localeCompare(mb!);
  });
  out(`\nDocker API calls per episode by kind: ${episodes} trivial episodes, fleet at ${setting.workers} worker process(es) x concurrency ${setting.concurrency}, `
    + `direct at concurrency ${setting.workers * setting.concurrency}, through a counting proxy (window: enqueue -> every sandbox removed)`);
  out(`  ${'kind'.padEnd(48)} ${'fleet'.padStart(6)} ${'direct'.padStart(6)}   fleet p50 ms  direct p50 ms (to first response byte)`);
  let fleetTotal = 0;
  let directTotal = 0;
  for (const k of kinds) {
    const fe = fleet.get(k);
    const de = direct.get(k);
    fleetTotal += fe?.n ?? 0;
    directTotal += de?.n ?? 0;
    out(`  ${k.padEnd(48)} ${((fe?.n ?? 0) / episodes).toFixed(2).padStart(6)} ${((de?.n ?? 0) / episodes).toFixed(2).padStart(6)}   `
      + `${ms(quantile(fe?.lat ?? [], 0.5)).padStart(12)}  ${ms(quantile(de?.lat ?? [], 0.5)).padStart(13)}`);
  }
  out(`  ${'total per episode'.padEnd(48)} ${(fleetTotal / episodes).toFixed(2).padStart(6)} ${(directTotal / episodes).toFixed(2).padStart(6)}`);
  const bg = [...fleet.entries()].filter(([k]) => background(k)).map(([k, e]) => `${k} x${e.n}`);
  out(`  background calls in the fleet's ${windowSec.toFixed(1)} s window (periodic, not per episode): ${bg.length > 0 ? bg.join(', ') : 'none'}`);
  for (const phase of ['worker start-up', 'warm-up', 'idle']) {
    const m = byPhase(phase);
    const list = [...m.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([k, e]) => `${k} x${e.n}`);
    out(`  ${phase} (not counted above): ${list.length > 0 ? list.join(', ') : 'none'}`);
  }
}

await main();
