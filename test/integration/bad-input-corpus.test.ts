// The bad-input corpus: every case is a batch (with its task folders) generated in a temp folder and
// handed to the real `rollout-fleet enqueue` as a process. Each must exit non-zero with a message
// naming the file and the field, without a stack trace, raw control characters or the contents of a
// file it read, without writing anything to Redis, within bounded wall time and memory (the child's
// max RSS, measured by /usr/bin/time or, without it, by polling VmHWM).
import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, symlink, truncate, writeFile } from 'node:fs/promises';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import { BIN } from '../helpers/fleet.ts';

/** Bounds every case must stay within. */
const MAX_WALL_MS = 20_000;
const MAX_RSS_KB = 256 * 1024;
/** Cases run a few at a time: the machine has 2 cores, shared with other test files. */
const CONCURRENCY = 3;
const TIME_BIN = '/usr/bin/time';

const GOOD_TASK = 'id: ok\ninstruction: Say hello.\nverify:\n  command: sh /tests/test.sh\n  timeoutSec: 20\n';
const GOOD_BATCH = 'name: corpus\ntasks: [tasks]\nagent: { kind: oracle }\n';
const SECRET_LINES = Array.from({ length: 12 }, (_, i) => `secret-line-${i}: s3cr3t-${i}-do-not-print`);

interface Layout {
  root: string;
  batch: string;
  /** The default task folder, tasks/ok. */
  task: string;
}

interface Case {
  name: string;
  /** Fragments the message must contain: the file and the field (and the value where it is short). */
  expect: string[];
  /** Fragments it must not contain (file contents). */
  absent?: string[];
  /** Write the case's files over the good layout (a good batch with one good oracle task). */
  build?: (l: Layout) => Promise<void>;
}

const taskYaml = (yaml: string) => async (l: Layout) => writeFile(path.join(l.task, 'task.yaml'), yaml);
const withTask = (extra: string) => taskYaml(`${GOOD_TASK}${extra}\n`);
const batchYaml = (yaml: string) => async (l: Layout) => writeFile(l.batch, yaml);
const withBatch = (extra: string) => batchYaml(`${GOOD_BATCH}${extra}\n`);
const mkfifo = (file: string): void => void execFileSync('mkfifo', [file]);
async function sparse(file: string, bytes: number): Promise<void> {
  await mkdir(path.dirname(file), { recursive: true });
  await writeFile(file, '');
  await truncate(file, bytes);
}

const T = 'tasks/ok/task.yaml: ';
const B = 'batch.yaml: ';

/** Filled in by beforeAll: the port of a listener that must never be reached. */
let probePort = 0;
let probeHits = 0;

const CASES: Case[] = [
  // The batch file itself.
  { name: 'batch file missing', expect: [B, 'cannot read'], build: async (l) => rm(l.batch) },
  { name: 'batch file is a folder', expect: [B, 'not a regular file'], build: async (l) => { await rm(l.batch); await mkdir(l.batch); } },
  { name: 'batch file is a FIFO', expect: [B, 'not a regular file'], build: async (l) => { await rm(l.batch); mkfifo(l.batch); } },
  { name: 'batch file links to /dev/zero', expect: [B, 'not a regular file'], build: async (l) => { await rm(l.batch); await symlink('/dev/zero', l.batch); } },
  { name: 'batch file of 100 MB', expect: [B, 'larger than'], build: async (l) => sparse(l.batch, 100 * 1024 * 1024) },
  { name: 'batch file not YAML', expect: [B, 'not valid YAML'], build: batchYaml('tasks: [tasks\nagent: {') },
  { name: 'batch file empty', expect: [B, '(root)'], build: batchYaml('') },
  { name: 'batch file a list', expect: [B, '(root)'], build: batchYaml('- tasks\n- agent\n') },
  { name: 'batch file a scalar', expect: [B, '(root)'], build: batchYaml('hello\n') },
  { name: 'batch file binary', expect: [B], build: async (l) => writeFile(l.batch, Buffer.from([0, 1, 2, 0xff, 0xfe, 10, 0x1b, 0x5b, 0x33, 0x31, 0x6d])) },
  { name: 'batch file YAML alias bomb', expect: [B], build: batchYaml(`a: &a ["x","x","x","x","x","x","x","x","x"]\n${Array.from({ length: 9 }, (_, i) => `${String.fromCharCode(98 + i)}: &${String.fromCharCode(98 + i)} [*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)},*${String.fromCharCode(97 + i)}]`).join('\n')}\n${GOOD_BATCH}`) },
  { name: 'batch file with 12 unknown secret keys', expect: [B, '(root)'], absent: SECRET_LINES.slice(1).map((s) => s.split(': ')[1]!), build: withBatch(SECRET_LINES.join('\n')) },
  { name: 'samples: two', expect: [B, 'samples:', '"two"'], build: batchYaml('name: c\ntasks: [tasks]\nsamples: two\nagent: { kind: oracle }\n') },
  { name: 'samples: 0', expect: [B, 'samples:', '(got 0)'], build: batchYaml('name: c\ntasks: [tasks]\nsamples: 0\nagent: { kind: oracle }\n') },
  { name: 'samples: -1', expect: [B, 'samples:'], build: batchYaml('name: c\ntasks: [tasks]\nsamples: -1\nagent: { kind: oracle }\n') },
  { name: 'samples: 1e9', expect: [B, 'samples:'], build: batchYaml('name: c\ntasks: [tasks]\nsamples: 1000000000\nagent: { kind: oracle }\n') },
  { name: 'samples: 1.5', expect: [B, 'samples:'], build: batchYaml('name: c\ntasks: [tasks]\nsamples: 1.5\nagent: { kind: oracle }\n') },
  { name: 'agent missing', expect: [B, 'agent:'], build: batchYaml('name: c\ntasks: [tasks]\n') },
  { name: 'agent kind wizard', expect: [B, 'agent.kind:', '"wizard"'], build: batchYaml('name: c\ntasks: [tasks]\nagent: { kind: wizard }\n') },
  { name: 'agent command empty', expect: [B, 'agent.command:'], build: batchYaml('name: c\ntasks: [tasks]\nagent: { kind: command, command: "" }\n') },
  { name: 'agent command of 200 KiB', expect: [B, 'agent.command:', 'bytes'], build: batchYaml(`name: c\ntasks: [tasks]\nagent: { kind: command, command: "${'x'.repeat(200 * 1024)}" }\n`) },
  { name: 'llm window below its output reserve', expect: [B, 'agent.outputReserveTokens:'], build: batchYaml('name: c\ntasks: [tasks]\nagent: { kind: llm, contextWindowTokens: 1024, outputReserveTokens: 4096 }\n') },
  { name: 'llm window equal to its output reserve', expect: [B, 'agent.outputReserveTokens:'], build: batchYaml('name: c\ntasks: [tasks]\nagent: { kind: llm, contextWindowTokens: 2048, outputReserveTokens: 2048 }\n') },
  { name: 'llm maxTurns 0', expect: [B, 'agent.maxTurns:'], build: batchYaml('name: c\ntasks: [tasks]\nagent: { kind: llm, maxTurns: 0 }\n') },
  { name: 'unknown key in batch', expect: [B, 'sample'], build: withBatch('sample: 3') },
  { name: 'name with capitals', expect: [B, 'name:', '"Corpus"'], build: batchYaml('name: Corpus\ntasks: [tasks]\nagent: { kind: oracle }\n') },
  { name: 'tasks empty', expect: [B, 'tasks:'], build: batchYaml('name: c\ntasks: []\nagent: { kind: oracle }\n') },
  { name: 'tasks path missing', expect: [B, 'tasks.0:', 'nowhere'], build: batchYaml('name: c\ntasks: [nowhere]\nagent: { kind: oracle }\n') },
  { name: 'tasks path a file', expect: [B, 'tasks.0:'], build: batchYaml('name: c\ntasks: [batch.yaml]\nagent: { kind: oracle }\n') },
  { name: 'tasks folder without task.yaml', expect: [B, 'tasks.0:'], build: async (l) => { await mkdir(path.join(l.root, 'empty')); await writeFile(l.batch, 'name: c\ntasks: [empty]\nagent: { kind: oracle }\n'); } },
  { name: 'file named .yaml without name', expect: ['.yaml: ', 'name:'], build: async (l) => { l.batch = path.join(l.root, '.yaml'); await writeFile(l.batch, 'tasks: [tasks]\nagent: { kind: oracle }\n'); } },
  { name: 'defaults.image with a shell command', expect: [B, 'defaults.image:', 'busybox; rm -rf /'], build: withBatch('defaults: { image: "busybox; rm -rf /" }') },
  { name: 'defaults.workdir /proc', expect: [B, 'defaults.workdir:', '"/proc"'], build: withBatch('defaults: { workdir: /proc }') },
  { name: 'defaults unknown key', expect: [B, 'defaults'], build: withBatch('defaults: { imag: busybox }') },
  { name: 'defaults.limits.memoryMb 1', expect: [B, 'defaults.limits.memoryMb:'], build: withBatch('defaults: { limits: { memoryMb: 1 } }') },
  { name: 'oracle and a task without solution/', expect: ['tasks/ok', 'solution/'], build: async (l) => rm(path.join(l.task, 'solution'), { recursive: true }) },
  { name: 'samples x instruction beyond what Redis should hold', expect: [B, 'samples:'], build: async (l) => { await writeFile(path.join(l.task, 'task.yaml'), `${GOOD_TASK}\n`.replace('Say hello.', 'y'.repeat(60 * 1024))); await writeFile(l.batch, 'name: c\ntasks: [tasks]\nsamples: 10000\nagent: { kind: oracle }\n'); } },
  { name: 'duplicate task ids', expect: [B, 'tasks:', '"ok"'], build: async (l) => { execFileSync('cp', ['-r', l.task, path.join(l.root, 'tasks', 'ok2')]); } },

  // task.yaml as a file.
  { name: 'task.yaml is a FIFO', expect: [T, 'not a regular file'], build: async (l) => { await rm(path.join(l.task, 'task.yaml')); mkfifo(path.join(l.task, 'task.yaml')); } },
  { name: 'task.yaml links to /dev/zero', expect: [T, 'not a regular file'], build: async (l) => { await rm(path.join(l.task, 'task.yaml')); await symlink('/dev/zero', path.join(l.task, 'task.yaml')); } },
  { name: 'task.yaml links to a secret file', expect: [T], absent: SECRET_LINES.map((s) => s.split(': ')[1]!), build: async (l) => { const secret = path.join(l.root, 'shadow'); await writeFile(secret, `${SECRET_LINES.join('\n')}\n`); await rm(path.join(l.task, 'task.yaml')); await symlink(secret, path.join(l.task, 'task.yaml')); } },
  { name: 'task.yaml links to /etc/passwd', expect: [T], absent: ['root:x:0:0'], build: async (l) => { await rm(path.join(l.task, 'task.yaml')); await symlink('/etc/passwd', path.join(l.task, 'task.yaml')); } },
  { name: 'task.yaml holds 12 unknown secret keys', expect: [T, '(root)'], absent: SECRET_LINES.slice(1).map((s) => s.split(': ')[1]!), build: withTask(SECRET_LINES.join('\n')) },
  { name: 'task.yaml is a folder', expect: [T, 'not a regular file'], build: async (l) => { await rm(path.join(l.task, 'task.yaml')); await mkdir(path.join(l.task, 'task.yaml')); } },
  { name: 'task.yaml of 100 MB', expect: [T, 'larger than'], build: async (l) => sparse(path.join(l.task, 'task.yaml'), 100 * 1024 * 1024) },
  { name: 'task.yaml not YAML', expect: [T, 'not valid YAML'], build: taskYaml('id: [ok\n') },
  { name: 'task.yaml empty', expect: [T, '(root)'], build: taskYaml('') },
  { name: 'task.yaml binary', expect: [T], build: async (l) => writeFile(path.join(l.task, 'task.yaml'), Buffer.from([0xff, 0xfe, 0, 0, 0x1b, 0x5d, 10, 0x9b, 0x32, 0x4a])) },

  // task.yaml fields.
  { name: 'id with capitals', expect: [T, 'id:', '"OK"'], build: taskYaml(GOOD_TASK.replace('id: ok', 'id: OK')) },
  { name: 'id missing', expect: [T, 'id:'], build: taskYaml(GOOD_TASK.replace('id: ok\n', '')) },
  { name: 'instruction missing', expect: [T, 'instruction:'], build: taskYaml(GOOD_TASK.replace('instruction: Say hello.\n', '')) },
  { name: 'instruction empty', expect: [T, 'instruction:'], build: taskYaml(GOOD_TASK.replace('Say hello.', '""')) },
  { name: 'instruction a number', expect: [T, 'instruction:'], build: taskYaml(GOOD_TASK.replace('Say hello.', '42')) },
  { name: 'instruction of 200 KiB', expect: [T, 'instruction:', 'bytes'], build: taskYaml(GOOD_TASK.replace('Say hello.', 'z'.repeat(200 * 1024))) },
  { name: 'instruction of 10 MiB, samples 40', expect: [T, 'larger than'], build: async (l) => { await writeFile(path.join(l.task, 'task.yaml'), GOOD_TASK.replace('Say hello.', 'z'.repeat(10 * 1024 * 1024))); await writeFile(l.batch, 'name: c\ntasks: [tasks]\nsamples: 40\nagent: { kind: oracle }\n'); } },
  { name: 'image ..// to a loopback listener', expect: [T, 'image:'], build: async (l) => writeFile(path.join(l.task, 'task.yaml'), `${GOOD_TASK}image: "..//127.0.0.1:${probePort}/x"\n`) },
  { name: 'image ..// to an unresolvable host', expect: [T, 'image:', 'ssrf-probe.invalid'], build: withTask('image: "..//ssrf-probe.invalid/x"') },
  { name: 'image with a shell command', expect: [T, 'image:', 'busybox; rm -rf /'], build: withTask('image: "busybox; rm -rf /"') },
  { name: 'image with capitals', expect: [T, 'image:', 'Rollout-Fleet/Sandbox:BusyBox'], build: withTask('image: "Rollout-Fleet/Sandbox:BusyBox"') },
  { name: 'image with a query string', expect: [T, 'image:'], build: withTask('image: "busybox/json?all=1#"') },
  { name: 'image with a bad digest', expect: [T, 'image:'], build: withTask('image: "busybox@sha256:xyz"') },
  { name: 'image with an escape and a newline', expect: [T, 'image:'], build: withTask('image: "busy\\e[31mbox\\nx"') },
  { name: 'image an empty string', expect: [T, 'image:'], build: withTask('image: ""') },
  { name: 'image not on the engine', expect: [T, 'image:', 'rollout-fleet/absent:1'], build: withTask('image: rollout-fleet/absent:1') },
  { name: 'workdir /', expect: [T, 'workdir:', '"/"'], build: withTask('workdir: /') },
  { name: 'workdir /proc', expect: [T, 'workdir:', '"/proc"'], build: withTask('workdir: /proc') },
  { name: 'workdir /proc/self/cwd', expect: [T, 'workdir:'], build: withTask('workdir: /proc/self/cwd') },
  { name: 'workdir /sys/fs', expect: [T, 'workdir:'], build: withTask('workdir: /sys/fs') },
  { name: 'workdir /dev', expect: [T, 'workdir:'], build: withTask('workdir: /dev') },
  { name: 'workdir /tests', expect: [T, 'workdir:', '"/tests"'], build: withTask('workdir: /tests') },
  { name: 'workdir /tests/', expect: [T, 'workdir:'], build: withTask('workdir: /tests/') },
  { name: 'workdir //proc', expect: [T, 'workdir:'], build: withTask('workdir: //proc') },
  { name: 'workdir /opt/rollout-fleet', expect: [T, 'workdir:', '"/opt/rollout-fleet"'], build: withTask('workdir: /opt/rollout-fleet') },
  { name: 'workdir /opt/rollout-fleet/bin', expect: [T, 'workdir:'], build: withTask('workdir: /opt/rollout-fleet/bin') },
  { name: 'workdir /solution', expect: [T, 'workdir:'], build: withTask('workdir: /solution') },
  { name: 'workdir relative', expect: [T, 'workdir:'], build: withTask('workdir: workspace') },
  { name: 'workdir with ..', expect: [T, 'workdir:'], build: withTask('workdir: /workspace/../proc') },
  { name: 'verify missing', expect: [T, 'verify:'], build: taskYaml('id: ok\ninstruction: x\n') },
  { name: 'verify.command empty', expect: [T, 'verify.command:'], build: taskYaml('id: ok\ninstruction: x\nverify: { command: "" }\n') },
  { name: 'verify.command of 200 KiB', expect: [T, 'verify.command:', 'bytes'], build: taskYaml(`id: ok\ninstruction: x\nverify: { command: "${'t'.repeat(200 * 1024)}" }\n`) },
  { name: 'verify.timeoutSec -5', expect: [T, 'verify.timeoutSec:', '(got -5)'], build: taskYaml('id: ok\ninstruction: x\nverify: { command: "true", timeoutSec: -5 }\n') },
  { name: 'verify unknown key', expect: [T, 'verify'], build: taskYaml('id: ok\ninstruction: x\nverify: { command: "true", timeout: 5 }\n') },
  { name: 'deadline leaves the agent no time', expect: [T, 'deadlineSec:', '(got 100)'], build: withTask('deadlineSec: 100') },
  { name: 'deadlineSec a string', expect: [T, 'deadlineSec:'], build: withTask('deadlineSec: soon') },
  { name: 'limits.memoryMb 1', expect: [T, 'limits.memoryMb:', '(got 1)'], build: withTask('limits: { memoryMb: 1 }') },
  { name: 'limits.pids 1e6', expect: [T, 'limits.pids:'], build: withTask('limits: { pids: 1000000 }') },
  { name: 'limits.cpus 0', expect: [T, 'limits.cpus:'], build: withTask('limits: { cpus: 0 }') },
  { name: 'reserves.verifySec below the verifier timeout', expect: [T, 'reserves.verifySec:'], build: withTask('reserves: { verifySec: 5 }') },
  { name: 'unknown key in task.yaml', expect: [T, 'timeout'], build: withTask('timeout: 5') },

  // The task folder.
  { name: 'workspace/ missing', expect: ['tasks/ok', 'workspace/'], build: async (l) => rm(path.join(l.task, 'workspace'), { recursive: true }) },
  { name: 'tests/ missing', expect: ['tests/'], build: async (l) => rm(path.join(l.task, 'tests'), { recursive: true }) },
  { name: 'workspace/ a file', expect: ['workspace/'], build: async (l) => { await rm(path.join(l.task, 'workspace'), { recursive: true }); await writeFile(path.join(l.task, 'workspace'), 'x'); } },
  { name: 'workspace over 32 MB', expect: ['tasks/ok', 'larger than'], build: async (l) => sparse(path.join(l.task, 'workspace', 'big.bin'), 40 * 1024 * 1024) },
  { name: 'workspace holds a FIFO', expect: ['tasks/ok', 'not a regular file'], build: async (l) => mkfifo(path.join(l.task, 'workspace', 'pipe')) },
  { name: 'task folder named with a newline and escapes', expect: ['image:', '\\n'], build: async (l) => { await mkdir(path.join(l.root, 'tasks', 'evil\n\u001b[31mred\u009b2J')); await writeFile(path.join(l.root, 'tasks', 'evil\n\u001b[31mred\u009b2J', 'task.yaml'), 'id: evil\ninstruction: x\nverify: { command: "true" }\nimage: "x y"\n'); await mkdir(path.join(l.root, 'tasks', 'evil\n\u001b[31mred\u009b2J', 'workspace')); await mkdir(path.join(l.root, 'tasks', 'evil\n\u001b[31mred\u009b2J', 'tests')); } },
  {
    name: 'twelve 30 MB tasks and an image the engine lacks',
    expect: ['image:', 'rollout-fleet/absent:1'],
    build: async (l) => {
      await rm(l.task, { recursive: true });
      for (let i = 0; i < 12; i++) {
        const dir = path.join(l.root, 'tasks', `big${i}`);
        await mkdir(path.join(dir, 'tests'), { recursive: true });
        await mkdir(path.join(dir, 'solution'), { recursive: true });
        await writeFile(path.join(dir, 'solution', 'solve.sh'), 'true\n');
        await writeFile(path.join(dir, 'task.yaml'), GOOD_TASK.replace('id: ok', `id: big${i}`));
        await sparse(path.join(dir, 'workspace', 'data.bin'), 30 * 1024 * 1024);
      }
      await writeFile(l.batch, `${GOOD_BATCH}defaults: { image: rollout-fleet/absent:1 }\n`);
    },
  },
];

interface Run {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  wallMs: number;
  maxRssKb: number;
}

/** VmHWM of a live process, in kB, or 0 once it is gone. */
async function vmHwmKb(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8').catch(() => '');
  return Number(/^VmHWM:\s+(\d+)/m.exec(status)?.[1] ?? 0);
}

/** `rollout-fleet enqueue <batch>` as a process group, killed at MAX_WALL_MS; its max RSS measured. */
async function enqueue(batch: string, env: NodeJS.ProcessEnv, scratch: string): Promise<Run> {
  const timeFile = path.join(scratch, 'time.out');
  const useTime = existsSync(TIME_BIN);
  const argv = useTime ? [TIME_BIN, '-f', '%M', '-o', timeFile, process.execPath, BIN, 'enqueue', batch] : [process.execPath, BIN, 'enqueue', batch];
  const started = Date.now();
  const child = spawn(argv[0]!, argv.slice(1), { env, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  let polledKb = 0;
  const poll = setInterval(() => void vmHwmKb(child.pid!).then((kb) => (polledKb = Math.max(polledKb, kb))), 50);
  const killer = setTimeout(() => process.kill(-child.pid!, 'SIGKILL'), MAX_WALL_MS);
  const [code, signal] = (await once(child, 'close')) as [number | null, NodeJS.Signals | null];
  clearTimeout(killer);
  clearInterval(poll);
  const wallMs = Date.now() - started;
  let maxRssKb = polledKb;
  if (useTime) {
    // time(1) appends "Command exited with non-zero status N" before the figure; the figure is last.
    const lines = (await readFile(timeFile, 'utf8').catch(() => '')).trim().split('\n');
    maxRssKb = Number(lines.at(-1)) || polledKb;
  }
  return { code, signal, stdout, stderr, wallMs, maxRssKb };
}

/** At most `n` cases at a time. */
function limiter(n: number) {
  let running = 0;
  const waiting: Array<() => void> = [];
  return async <T>(fn: () => Promise<T>): Promise<T> => {
    if (running >= n) await new Promise<void>((r) => waiting.push(r));
    running += 1;
    try {
      return await fn();
    } finally {
      running -= 1;
      waiting.shift()?.();
    }
  };
}

describe('bad-input corpus', () => {
  let redis: PrivateRedis;
  let client: Redis;
  let probe: http.Server;
  const figures: Array<{ name: string; wallMs: number; maxRssKb: number }> = [];
  const limit = limiter(CONCURRENCY);

  beforeAll(async () => {
    redis = await startPrivateRedis();
    client = new Redis(redis.url, { connectionName: 'rf-corpus' });
    probe = http.createServer((req, res) => {
      probeHits += 1;
      res.end('{}');
    });
    probe.listen(0, '127.0.0.1');
    await once(probe, 'listening');
    probePort = (probe.address() as AddressInfo).port;
    expect(await client.dbsize()).toBe(0);
  });

  afterAll(async () => {
    probe?.close();
    await client?.quit();
    await redis?.stop();
    if (figures.length > 0) {
      const slowest = figures.reduce((a, b) => (b.wallMs > a.wallMs ? b : a));
      const biggest = figures.reduce((a, b) => (b.maxRssKb > a.maxRssKb ? b : a));
      const report = { cases: figures.length, maxWallMs: slowest.wallMs, slowest: slowest.name, maxRssKb: biggest.maxRssKb, biggest: biggest.name, figures };
      await writeFile(path.join(os.tmpdir(), 'rf-bad-input-corpus.json'), JSON.stringify(report, null, 2));
      console.log(`bad-input corpus: ${figures.length} cases, max wall ${slowest.wallMs} ms (${slowest.name}), max RSS ${Math.round(biggest.maxRssKb / 1024)} MB (${biggest.name})`);
    }
  });

  it('has at least 60 cases', () => {
    expect(CASES.length).toBeGreaterThanOrEqual(60);
  });

  it.concurrent.each(CASES.map((c) => [c.name, c] as const))('%s', async (_name, c) => {
    await limit(async () => {
      const root = await mkdtemp(path.join(os.tmpdir(), 'rf-corpus-'));
      try {
        const l: Layout = { root, batch: path.join(root, 'batch.yaml'), task: path.join(root, 'tasks', 'ok') };
        await mkdir(path.join(l.task, 'workspace'), { recursive: true });
        await mkdir(path.join(l.task, 'tests'), { recursive: true });
        await mkdir(path.join(l.task, 'solution'), { recursive: true });
        await writeFile(path.join(l.task, 'solution', 'solve.sh'), 'echo hello > hello.txt\n');
        await writeFile(path.join(l.task, 'tests', 'test.sh'), 'test -f hello.txt\n');
        await writeFile(path.join(l.task, 'task.yaml'), GOOD_TASK);
        await writeFile(l.batch, GOOD_BATCH);
        await c.build?.(l);
        const prefix = `c${figures.length}${Math.random().toString(16).slice(2, 8)}`;
        const hitsBefore = probeHits;
        const env = { ...process.env, REDIS_URL: redis.url, FLEET_PREFIX: prefix, FLEET_DATA_DIR: path.join(root, 'data'), LOG_LEVEL: 'warn' };
        const run = await enqueue(l.batch, env, root);
        figures.push({ name: c.name, wallMs: run.wallMs, maxRssKb: run.maxRssKb });
        const context = `${c.name}: exit ${run.code} ${run.signal ?? ''}\n${run.stderr.slice(0, 2000)}`;
        expect(run.signal, context).toBeNull();
        expect(run.code, context).not.toBe(0);
        expect(run.stdout, context).toBe('');
        for (const fragment of c.expect) expect(run.stderr, context).toContain(fragment);
        for (const fragment of c.absent ?? []) expect(run.stderr, context).not.toContain(fragment);
        expect(run.stderr, context).not.toMatch(/^\s+at /m);
        // No raw control character but the newlines between problems reaches the terminal.
        expect(run.stderr, context).not.toMatch(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/);
        expect(await client.keys(`${prefix}*`), context).toEqual([]);
        expect(probeHits - hitsBefore, `${c.name}: requests that reached the probe listener`).toBe(0);
        expect(run.wallMs, context).toBeLessThan(MAX_WALL_MS);
        expect(run.maxRssKb, context).toBeLessThan(MAX_RSS_KB);
      } finally {
        await rm(root, { recursive: true, force: true });
      }
    });
  });

  it('wrote nothing to Redis in all', async () => {
    // Runs after the concurrent cases (vitest awaits them first within this file's order).
    expect(await client.dbsize()).toBe(0);
  });
});
