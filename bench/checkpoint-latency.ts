// Checkpoint latency, from "agent emitted" (CheckpointSink.offer) to "durable on disk" (the writer
// persisted it and moved latest.json), at a steady rate with realistic sizes, through the sink, the
// `checkpoints` queue on a Redis with AOF fsync always, and the writer: once as its own process
// (`rollout-fleet checkpoint-writer`) and once inside the offering process. The baseline, in the same
// run, writes the same bytes directly (temp file + fsync + rename, per file) on the same schedule: what
// a synchronous writer costs. Then the writer's throughput on a backlog, against direct writes.
// Run: npm run build && npx tsx bench/checkpoint-latency.ts [--seconds 15] [--rate 20] [--episodes 4]
//      [--transcript-kb 50] [--workspace-kb 256] [--backlog 200] [--rounds 3] [--redis durable|volatile]
// Each variant runs `rounds` segments, interleaved with the others, so all see the same background load.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdir, mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Queue, type Job } from 'bullmq';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { CHECKPOINTS_QUEUE, type CheckpointJob, type CheckpointResult } from '../queues/checkpoints/contract.ts';
import { tarBuffer } from '../src/archive/tar-buffer.ts';
import { CheckpointSink } from '../src/checkpoints/checkpoint-sink.ts';
import type { CheckpointOffer } from '../src/checkpoints/checkpoint.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { writeFileAtomic } from '../src/files/atomic-write.ts';
import { startCheckpointWriter } from '../src/worker/checkpoint-writer.ts';

/** The compiled CLI (`npm run build`), as workers run it. */
const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));
const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '15' },
    rate: { type: 'string', default: '20' },
    episodes: { type: 'string', default: '4' },
    'transcript-kb': { type: 'string', default: '50' },
    'workspace-kb': { type: 'string', default: '256' },
    backlog: { type: 'string', default: '200' },
    rounds: { type: 'string', default: '3' },
    /** durable: AOF with fsync always, as production should run; volatile: no AOF (to see what Redis's fsyncs cost). */
    redis: { type: 'string', default: 'durable' },
  },
});
const num = (name: keyof typeof values) => {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`--${name}: expected an integer from 1 up, got ${JSON.stringify(values[name])}`);
  return n;
};
const seconds = num('seconds');
const rate = num('rate');
const episodes = num('episodes');
const transcriptBytes = num('transcript-kb') * 1024;
const workspaceBytes = num('workspace-kb') * 1024;
const backlog = num('backlog');
const rounds = num('rounds');
if (values.redis !== 'durable' && values.redis !== 'volatile') throw new TypeError(`--redis: expected durable or volatile, got ${JSON.stringify(values.redis)}`);
const durable = values.redis === 'durable';
const count = seconds * rate;
const intervalMs = 1000 / rate;
const silent = pino({ level: 'silent' });

// ---- the bytes ------------------------------------------------------------------------------------
function offerOf(episodeId: string, seq: number): CheckpointOffer {
  const messages: unknown[] = [{ role: 'user', content: 'fix the failing test' }];
  while (messages.length * 1_000 < transcriptBytes) messages.push({ role: 'assistant', content: `turn ${messages.length}: ${'x'.repeat(960)}` });
  return { episodeId, seq, turn: seq, messages, usage: { promptTokens: 1_000 * seq, completionTokens: 100 * seq, totalTokens: 1_100 * seq }, agentMs: 2_000 * seq, createdAt: new Date().toISOString() };
}
async function makeTar(): Promise<Buffer> {
  const body = Buffer.alloc(workspaceBytes - 3 * 512 - 1024, 'a');
  return tarBuffer((pack) => {
    pack.entry({ name: 'workspace/', type: 'directory' });
    pack.entry({ name: 'workspace/state.bin', size: body.length }, body);
  });
}
const chunked = (data: Buffer) => Readable.from(Array.from({ length: Math.ceil(data.length / 65_536) }, (_, i) => data.subarray(i * 65_536, (i + 1) * 65_536)), { objectMode: false });

// ---- figures --------------------------------------------------------------------------------------
const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length === 0 ? NaN : s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]!;
};
const ms = (x: number) => `${x.toFixed(1)} ms`;
const line = (label: string, xs: number[]) => `${label.padEnd(34)} p50 ${ms(pct(xs, 50)).padStart(9)}   p99 ${ms(pct(xs, 99)).padStart(9)}   max ${ms(Math.max(...xs)).padStart(9)}   n=${xs.length}`;

/** Call `fn(i)` at t0 + i * interval for i < n (it is not awaited: a slow one does not shift the schedule). */
async function paced(n: number, fn: (i: number, scheduledAt: number) => void): Promise<void> {
  const t0 = performance.now() + 50;
  for (let i = 0; i < n; i++) {
    const at = t0 + i * intervalMs;
    const wait = at - performance.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    fn(i, at);
  }
}

// ---- set-up ---------------------------------------------------------------------------------------
const redis = await startPrivateRedis({ durable });
const client = new Redis(redis.url, { maxRetriesPerRequest: null });
const root = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-cp-'));
const children: ChildProcess[] = [];
const workspace = await makeTar();
const jsonBytes = Buffer.byteLength(JSON.stringify(offerOf('e', 1)));
const episodeIds = Array.from({ length: episodes }, (_, i) => `bench-${i}`);

async function spawnWriter(prefix: string, dataDir: string): Promise<ChildProcess> {
  const child = spawn(process.execPath, [BIN, 'checkpoint-writer', '--concurrency', '4'], {
    env: { ...process.env, REDIS_URL: redis.url, FLEET_PREFIX: prefix, FLEET_DATA_DIR: dataDir, LOG_LEVEL: 'info', FLEET_WORKER_ID: `bench-${prefix}` },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  children.push(child);
  let err = '';
  await new Promise<void>((resolve, reject) => {
    child.stderr!.on('data', (d: Buffer) => {
      err += d.toString();
      if (err.includes('checkpoint writer started')) resolve();
    });
    child.once('exit', (code) => reject(new Error(`checkpoint-writer exited ${code}: ${err}`)));
  });
  return child;
}
async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = once(child, 'exit');
  child.kill('SIGTERM');
  await exited;
}
async function drained(queue: Queue): Promise<Job[]> {
  for (;;) {
    const c = (await queue.getJobCounts('waiting', 'active', 'delayed')) as Record<string, number>;
    if (c.waiting! + c.active! + c.delayed! === 0) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  return queue.getJobs(['completed'], 0, -1);
}

// ---- 1. baseline: the same bytes written directly, on the same schedule ----------------------------
async function baseline(n: number, firstSeq: number, latencies: number[]): Promise<void> {
  const dir = path.join(root, 'direct');
  const writes: Promise<void>[] = [];
  await paced(n, (i, at) => {
    const cp = offerOf(episodeIds[i % episodes]!, firstSeq + Math.floor(i / episodes));
    writes.push((async () => {
      const folder = path.join(dir, cp.episodeId, String(cp.seq).padStart(8, '0'));
      await mkdir(folder, { recursive: true });
      await writeFileAtomic(path.join(folder, 'checkpoint.json'), JSON.stringify(cp));
      await writeFileAtomic(path.join(folder, 'workspace.tar'), workspace);
      latencies.push(performance.now() - at);
    })());
  });
  await Promise.all(writes);
}

// ---- 2. the pipeline ------------------------------------------------------------------------------
interface Pipeline {
  label: string;
  prefix: string;
  queue: Queue;
  loop: ReturnType<typeof monitorEventLoopDelay>;
  offerCallUs: number[];
  stats: CheckpointSink['stats'];
  stop(): Promise<void>;
}
async function startPipeline(label: string, prefix: string, writerKind: 'process' | 'in-process'): Promise<Pipeline> {
  const dataDir = path.join(root, prefix);
  const queue = new Queue(CHECKPOINTS_QUEUE, { connection: client, prefix });
  const stats = { offered: 0, replaced: 0, handedOver: 0, superseded: 0, failed: 0 };
  const base = { label, prefix, queue, loop: monitorEventLoopDelay({ resolution: 1 }), offerCallUs: [], stats };
  if (writerKind === 'process') {
    const child = await spawnWriter(prefix, dataDir);
    return { ...base, stop: async () => { await stopChild(child); await queue.close(); } };
  }
  const conn = client.duplicate();
  const worker = startCheckpointWriter({ connection: conn, prefix, dataDir, log: silent, name: 'bench', concurrency: 4 });
  await worker.waitUntilReady();
  return { ...base, stop: async () => { await worker.close(); await conn.quit(); await queue.close(); } };
}
/** One segment: `n` offers on the schedule through a fresh sink, then until the writer is idle. */
async function pipelineSegment(p: Pipeline, n: number, firstSeq: number): Promise<void> {
  const sink = new CheckpointSink({ connection: client, queue: p.queue, prefix: p.prefix, log: silent });
  p.loop.enable();
  await paced(n, (i) => {
    const cp = offerOf(episodeIds[i % episodes]!, firstSeq + Math.floor(i / episodes));
    const tar = chunked(workspace);
    const t = performance.now();
    sink.offer(cp, tar);
    p.offerCallUs.push((performance.now() - t) * 1000);
  });
  await sink.close();
  await drained(p.queue);
  p.loop.disable();
  for (const k of Object.keys(p.stats) as (keyof typeof p.stats)[]) p.stats[k] += sink.stats[k];
}
interface PipelineFigures {
  latencies: number[];
  handOff: number[];
  queued: number[];
  write: number[];
  written: number;
}
async function figures(p: Pipeline): Promise<PipelineFigures> {
  const run: PipelineFigures = { latencies: [], handOff: [], queued: [], write: [], written: 0 };
  for (const job of await p.queue.getJobs(['completed'], 0, -1)) {
    const result = job.returnvalue as CheckpointResult | null;
    if (result?.outcome !== 'written') continue;
    const emitted = Date.parse((job.data as CheckpointJob).createdAt);
    const durable = Date.parse(result.durableAt);
    run.written += 1;
    run.latencies.push(durable - emitted);
    run.handOff.push(job.timestamp - emitted);
    run.queued.push(job.processedOn! - job.timestamp);
    run.write.push(durable - job.processedOn!);
  }
  return run;
}

// ---- 3. throughput on a backlog ---------------------------------------------------------------------
async function writerThroughput(prefix: string): Promise<number> {
  const dataDir = path.join(root, prefix);
  const queue = new Queue(CHECKPOINTS_QUEUE, { connection: client, prefix });
  const sink = new CheckpointSink({ connection: client, queue, prefix, log: silent });
  for (let i = 0; i < backlog; i++) sink.offer(offerOf(`backlog-${i}`, 0), chunked(workspace));
  await sink.close();
  const child = await spawnWriter(prefix, dataDir);
  const jobs = await drained(queue);
  await stopChild(child);
  await queue.close();
  const start = Math.min(...jobs.map((j) => j.processedOn!));
  const end = Math.max(...jobs.map((j) => j.finishedOn!));
  return jobs.length / ((end - start) / 1000);
}
async function directThroughput(concurrency: number): Promise<number> {
  const dir = path.join(root, `direct-backlog-${concurrency}`);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(Array.from({ length: concurrency }, async () => {
    for (let i = next++; i < backlog; i = next++) {
      const folder = path.join(dir, `backlog-${i}`, '00000000');
      await mkdir(folder, { recursive: true });
      await writeFileAtomic(path.join(folder, 'checkpoint.json'), JSON.stringify(offerOf(`backlog-${i}`, 0)));
      await writeFileAtomic(path.join(folder, 'workspace.tar'), workspace);
    }
  }));
  return backlog / ((performance.now() - t0) / 1000);
}

try {
  const kb = (n: number) => `${Math.round(n / 1024)} KB`;
  process.stdout.write(`checkpoints at ${rate}/s for ${seconds} s (${count}) per variant, ${episodes} episodes; transcript ${kb(jsonBytes)}, workspace tar ${kb(workspace.length)}; Redis ${durable ? 'AOF fsync always' : 'without AOF'}; ${rounds} rounds of ${seconds / rounds} s per variant, interleaved; load average ${os.loadavg().map((l) => l.toFixed(1)).join(' ')}\n\n`);
  const viaProcess = await startPipeline('pipeline, writer process', 'p1', 'process');
  const inProcess = await startPipeline('pipeline, writer in-process', 'p2', 'in-process');
  const direct: number[] = [];
  const perRound = Math.floor(count / rounds);
  for (let r = 0; r < rounds; r++) {
    // Interleaved, so every variant sees the same background load on this shared machine.
    const firstSeq = r * Math.ceil(perRound / episodes);
    await baseline(perRound, firstSeq, direct);
    await pipelineSegment(viaProcess, perRound, firstSeq);
    await pipelineSegment(inProcess, perRound, firstSeq);
  }
  process.stdout.write('latency from emitted to durable on disk\n');
  process.stdout.write(`${line('baseline: direct write', direct)}\n`);
  const p99s: number[] = [];
  for (const p of [viaProcess, inProcess]) {
    const run = await figures(p);
    p99s.push(pct(run.latencies, 99));
    process.stdout.write(`${line(p.label, run.latencies)}   written ${run.written}/${p.stats.offered}\n`);
    process.stdout.write(`${line('  hand-off (offer -> job added)', run.handOff)}\n`);
    process.stdout.write(`${line('  queued (-> writer took it)', run.queued)}\n`);
    process.stdout.write(`${line('  write (-> latest.json durable)', run.write)}\n`);
    process.stdout.write(`  offer() call p50 ${pct(p.offerCallUs, 50).toFixed(0)} us, p99 ${pct(p.offerCallUs, 99).toFixed(0)} us; event-loop delay p99 ${(p.loop.percentile(99) / 1e6).toFixed(1)} ms; sink ${JSON.stringify(p.stats)}\n`);
    await p.stop();
  }
  const persistence = await client.info('persistence');
  const field = (name: string) => /^(\w+):(.*)$/m.exec(persistence.split('\n').find((l) => l.startsWith(`${name}:`)) ?? '')?.[2]?.trim() ?? '?';
  process.stdout.write(`  redis: aof_rewrites ${field('aof_rewrites')}, aof_delayed_fsync ${field('aof_delayed_fsync')}\n`);
  const writerRate = await writerThroughput('p3');
  const direct1 = await directThroughput(1);
  const direct4 = await directThroughput(4);
  process.stdout.write(`\nthroughput on a backlog of ${backlog} (transcript + workspace = ${kb(jsonBytes + workspace.length)} each)\n`);
  const mbs = (r: number) => `${((r * (jsonBytes + workspace.length)) / 1024 / 1024).toFixed(1)} MB/s`;
  process.stdout.write(`  writer process, concurrency 4:  ${writerRate.toFixed(0)} checkpoints/s (${mbs(writerRate)})\n`);
  process.stdout.write(`  direct writes, concurrency 1:   ${direct1.toFixed(0)} checkpoints/s (${mbs(direct1)})\n`);
  process.stdout.write(`  direct writes, concurrency 4:   ${direct4.toFixed(0)} checkpoints/s (${mbs(direct4)})\n`);
  const base = pct(direct, 99);
  process.stdout.write(`\nratios: pipeline p99 / direct p99 = ${(p99s[0]! / base).toFixed(2)} (writer process), ${(p99s[1]! / base).toFixed(2)} (in-process); writer throughput / direct (concurrency 4) = ${(writerRate / direct4).toFixed(2)}\n`);
} finally {
  await Promise.all(children.map(stopChild));
  await client.quit();
  await redis.stop();
  await rm(root, { recursive: true, force: true });
}
