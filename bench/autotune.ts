// Self-tuning concurrency against a sweep of fixed ones, in the same run, on a private Redis and the
// local Docker engine: one worker process (the compiled CLI) per run, one batch of trivial command-agent
// episodes each (`sleep <agent-sec>` then a one-line fix), first at each fixed concurrency of the sweep
// (FLEET_WORKER_AUTOTUNE=false), then self-tuning with the ceiling (FLEET_WORKER_AUTOTUNE=true). Prints
// episodes/s of each, the best fixed one, the ratio self-tuning / best fixed (goal: at least 0.95), the
// episodes that failed for infrastructure (docker_timeout, phase_timeout, other) or needed a retry at
// each setting, and the allowance's path under self-tuning; then a markdown table for docs/PERFORMANCE.md.
//
// Throughput is counted from the batch's enqueue to its last result (as bench/throughput.ts does), and
// also to its last sandbox removed (the cleanup queue removes them after the results: high concurrency
// leaves a backlog of removals, which is work the host still has to do).
//
// Run: npm run build && npx tsx bench/autotune.ts [--episodes 80] [--levels 1,2,4,8,16] [--ceiling 32]
// [--agent-sec 1] [--rounds 1] [--call-timeout-ms 30000] [--trace windows.jsonl] (`--levels none`: self-tuning only). With several rounds, the order of the settings
// alternates (forward, then backward) so that drifts of the machine's background load even out, and
// each setting's figure is its median over the rounds.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { FlowProducer, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { CLEANUP_QUEUE } from '../queues/cleanup/contract.ts';
import { EPISODES_QUEUE } from '../queues/episodes/contract.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { phaseTimings } from '../src/dashboard/batch-stats.ts';
import { enqueueBatch } from '../src/producer/enqueue-batch.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { LABEL } from '../src/sandbox/labels.ts';
import { loadBatch } from '../src/tasks/load-task.ts';
import { poll, writeCommandBatch } from './command-batch.ts';

/** The compiled CLI (`npm run build`), as workers run it. */
const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));

const { values } = parseArgs({
  options: {
    episodes: { type: 'string', default: '80' },
    levels: { type: 'string', default: '1,2,4,8,16' },
    ceiling: { type: 'string', default: '32' },
    'agent-sec': { type: 'string', default: '1' },
    rounds: { type: 'string', default: '1' },
    'call-timeout-ms': { type: 'string', default: '30000' },
    /** Write every window of the self-tuning worker (decisions, holds, latency) to this file, as JSON lines. */
    trace: { type: 'string' },
  },
});
const int = (name: string, v: string | undefined) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 1) throw new TypeError(`--${name}: expected an integer from 1 up, got ${v}`);
  return n;
};
const episodes = int('episodes', values.episodes);
const levels = values.levels === 'none' ? [] : values.levels!.split(',').map((v) => int('levels', v));
const ceiling = int('ceiling', values.ceiling);
const rounds = int('rounds', values.rounds);
const callTimeoutMs = int('call-timeout-ms', values['call-timeout-ms']);
const agentSec = Number(values['agent-sec']);
if (!(agentSec >= 0)) throw new TypeError(`--agent-sec: expected a number from 0 up, got ${agentSec}`);

type Setting = { kind: 'fixed'; concurrency: number } | { kind: 'autotune'; concurrency: number };
const label = (s: Setting) => (s.kind === 'fixed' ? `fixed ${s.concurrency}` : `self-tuning, ceiling ${s.concurrency}`);

interface Run {
  setting: Setting;
  seconds: number;
  perSec: number;
  /** Until the last sandbox was removed too. */
  drainedPerSec: number;
  passed: number;
  dockerTimeouts: number;
  phaseTimeouts: number;
  otherErrors: number;
  /** Episodes that took more than one attempt (an infrastructure failure was retried). */
  retried: number;
  phases: string;
  /** Self-tuning only: the allowance's changes, as the worker logged them (ms since enqueue). */
  allowance?: { at: number; to: number }[];
  load: number;
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};

/** Time-weighted mean allowance from enqueue to the end, and its path (consecutive repeats folded). */
function allowanceSummary(changes: { at: number; to: number }[], initial: number, endMs: number): { mean: number; path: string; cuts: number } {
  let mean = 0;
  let value = initial;
  let t = 0;
  let cuts = 0;
  for (const c of changes) {
    const at = Math.min(Math.max(c.at, 0), endMs);
    mean += value * (at - t);
    if (c.to < value) cuts++;
    value = c.to;
    t = at;
  }
  mean += value * (endMs - t);
  const path = [initial, ...changes.map((c) => c.to)].join(' > ');
  return { mean: mean / Math.max(1, endMs), path: path.length > 160 ? `${path.slice(0, 157)}...` : path, cuts };
}

async function main(): Promise<void> {
  const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench' });
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-autotune-'));
  // A prefix of its own: workers reap every sandbox of their prefix that no live worker of their Redis
  // owns, so a shared prefix on a shared engine would have them remove another bench's sandboxes.
  const prefix = `autotune${randomBytes(3).toString('hex')}`;
  const queue = new Queue(EPISODES_QUEUE, { connection: client, prefix });
  const cleanup = new Queue(CLEANUP_QUEUE, { connection: client, prefix });
  const flows = new FlowProducer({ connection: client, prefix });
  const results = new ResultsStore(client, prefix, path.join(dir, 'data'));
  const children: ChildProcess[] = [];
  const stopAll = async () => {
    await Promise.all(children.splice(0).map(async (c) => {
      if (c.exitCode === null && c.signalCode === null) {
        c.kill('SIGTERM');
        await once(c, 'exit');
      }
    }));
  };
  let serial = 0;
  const trace: string[] = [];

  async function run(setting: Setting, count: number): Promise<Run> {
    const name = `autotune-${++serial}`;
    const env = {
      ...process.env, REDIS_URL: redis.url, FLEET_PREFIX: prefix, FLEET_DATA_DIR: path.join(dir, 'data'),
      FLEET_DOCKER_CALL_TIMEOUT_MS: String(callTimeoutMs), FLEET_WORKER_AUTOTUNE: String(setting.kind === 'autotune'),
      // Info for the allowance's changes; the rest of the worker's info lines are few.
      LOG_LEVEL: values.trace ? 'debug' : setting.kind === 'autotune' ? 'info' : 'warn', FLEET_WORKER_ID: name,
    };
    const child = spawn(process.execPath, [BIN, 'worker', '--concurrency', String(setting.concurrency)], { env, stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(child);
    const changes: { at: number; to: number }[] = [];
    let started = 0;
    let tail = '';
    child.stderr!.on('data', (chunk: Buffer) => {
      const lines = (tail + chunk.toString()).split('\n');
      tail = lines.pop()!;
      for (const line of lines) {
        if (!line.startsWith('{')) {
          process.stderr.write(`${line}\n`);
          continue;
        }
        const entry = JSON.parse(line) as { level: number; msg: string; allowance?: number };
        if (/^concurrency allowance/.test(entry.msg) && values.trace) trace.push(JSON.stringify({ setting: label(setting), at: Math.round(performance.now() - started), ...entry }));
        if (/^concurrency allowance (in|de)creased/.test(entry.msg) && entry.allowance !== undefined) changes.push({ at: performance.now() - started, to: entry.allowance });
        else if (entry.level >= 40) process.stderr.write(`${line}\n`);
      }
    });
    // Timing starts once the worker is connected, so start-up is not measured.
    await poll('the worker to connect', 60_000, async () => (await queue.getWorkers()).length >= 1);
    const file = await writeCommandBatch(dir, name, { samples: count, command: `sleep ${agentSec}; echo fixed > state.txt` });
    started = performance.now();
    const plan = await enqueueBatch(await loadBatch(file), { flows, redis: client, prefix, results });
    await poll(`${count} results`, 1_800_000, async () => (await results.resultCount(plan.batchId)) >= count);
    const seconds = (performance.now() - started) / 1000;
    const load = os.loadavg()[0]!;
    const all = await results.results(plan.batchId);
    // The cleanup queue removes every sandbox of the batch before the next run; then the worker stops.
    await poll('sandboxes to be removed', 600_000, async () => {
      const counts = await cleanup.getJobCounts('waiting', 'active');
      const left = await docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } });
      return Object.values(counts).every((n) => n === 0) && left.length === 0;
    }, 200);
    const drainedSeconds = (performance.now() - started) / 1000;
    await stopAll();
    const codes = all.filter((r) => r.status === 'error').map((r) => r.error?.code);
    const phases = phaseTimings(all).map((t) => `${t.phase} ${((t.p50Ms ?? 0) / 1000).toFixed(1)}`).join(', ');
    return {
      setting, seconds, perSec: count / seconds, drainedPerSec: count / drainedSeconds,
      passed: all.filter((r) => r.status === 'passed').length,
      dockerTimeouts: codes.filter((c) => c === 'docker_timeout').length,
      phaseTimeouts: codes.filter((c) => c === 'phase_timeout').length,
      otherErrors: all.filter((r) => r.status !== 'passed' && r.error?.code !== 'docker_timeout' && r.error?.code !== 'phase_timeout').length,
      retried: all.filter((r) => r.attempts > 1).length,
      phases: `p50 s: ${phases}`,
      ...(setting.kind === 'autotune' && { allowance: changes }),
      load,
    };
  }

  const settings: Setting[] = [...levels.map((c) => ({ kind: 'fixed' as const, concurrency: c })), { kind: 'autotune', concurrency: ceiling }];
  const byLabel = new Map<string, Run[]>(settings.map((s) => [label(s), []]));
  try {
    process.stderr.write(`bench: ${episodes} episodes per run, agent ${agentSec} s, call timeout ${callTimeoutMs} ms, ${os.cpus().length} cores, load ${os.loadavg()[0]!.toFixed(1)}\n`);
    // Untimed: the runtime generation is installed on the engine and the image's layers are warm.
    await run({ kind: 'fixed', concurrency: 2 }, 4);
    const roundRatios: number[] = [];
    for (let round = 1; round <= rounds; round++) {
      const order = round % 2 === 1 ? settings : [...settings].reverse();
      const thisRound: Run[] = [];
      for (const setting of order) {
        const r = await run(setting, episodes);
        byLabel.get(label(setting))!.push(r);
        thisRound.push(r);
        const failures = `docker_timeout ${r.dockerTimeouts}, phase_timeout ${r.phaseTimeouts}, other ${r.otherErrors}, retried ${r.retried}`;
        process.stdout.write(`round ${round}: ${label(setting).padEnd(24)} ${r.seconds.toFixed(1).padStart(6)} s, ${r.perSec.toFixed(2)} episodes/s (${r.drainedPerSec.toFixed(2)} with removals); ${failures}; ${r.phases}; load ${r.load.toFixed(1)}\n`);
        if (r.allowance) {
          const a = allowanceSummary(r.allowance, Math.min(ceiling, 4), r.seconds * 1000);
          process.stdout.write(`         allowance: mean ${a.mean.toFixed(1)}, ${a.cuts} cut(s): ${a.path}\n`);
        }
      }
      const fixedRuns = thisRound.filter((r) => r.setting.kind === 'fixed');
      const autoRun = thisRound.find((r) => r.setting.kind === 'autotune');
      if (fixedRuns.length > 0 && autoRun) {
        const bestOfRound = fixedRuns.reduce((a, b) => (b.perSec > a.perSec ? b : a));
        roundRatios.push(autoRun.perSec / bestOfRound.perSec);
        process.stdout.write(`round ${round}: self-tuning / best fixed of the round (${label(bestOfRound.setting)}): ${roundRatios.at(-1)!.toFixed(2)}x\n`);
      }
    }
    const summary = settings.map((s) => {
      const runs = byLabel.get(label(s))!;
      return {
        setting: s, runs,
        perSec: median(runs.map((r) => r.perSec)),
        drainedPerSec: median(runs.map((r) => r.drainedPerSec)),
      };
    });
    if (values.trace) await writeFile(values.trace, trace.map((l) => `${l}\n`).join(''));
    const fixed = summary.filter((s) => s.setting.kind === 'fixed');
    if (fixed.length === 0) return;
    const best = fixed.reduce((a, b) => (b.perSec > a.perSec ? b : a));
    const bestDrained = fixed.reduce((a, b) => (b.drainedPerSec > a.drainedPerSec ? b : a));
    const auto = summary.find((s) => s.setting.kind === 'autotune')!;
    const ratio = auto.perSec / best.perSec;
    const ratioDrained = auto.drainedPerSec / bestDrained.drainedPerSec;
    const of = rounds > 1 ? ` (medians of ${rounds} rounds)` : '';
    process.stdout.write(`best fixed: ${label(best.setting)}, ${best.perSec.toFixed(2)} episodes/s${of}\n`);
    process.stdout.write(`self-tuning / best fixed: ${ratio.toFixed(2)}x (goal >= 0.95x); with removals: ${ratioDrained.toFixed(2)}x against ${label(bestDrained.setting)}\n`);
    if (rounds > 1) process.stdout.write(`self-tuning / best fixed of the same round: ${roundRatios.map((r) => r.toFixed(2)).join(', ')}; median ${median(roundRatios).toFixed(2)}x\n`);
    const sum = (runs: Run[], f: (r: Run) => number) => runs.reduce((n, r) => n + f(r), 0);
    process.stdout.write(`\n| setting | episodes/s | with removals | vs best fixed | docker_timeout | phase_timeout | other errors | retried |\n|---|---|---|---|---|---|---|---|\n`);
    for (const s of summary) {
      const runs = s.runs;
      const name = s === best ? `**${label(s.setting)}**` : label(s.setting);
      process.stdout.write(`| ${name} | ${s.perSec.toFixed(2)} | ${s.drainedPerSec.toFixed(2)} | ${(s.perSec / best.perSec).toFixed(2)}x | ${sum(runs, (r) => r.dockerTimeouts)} | ${sum(runs, (r) => r.phaseTimeouts)} | ${sum(runs, (r) => r.otherErrors)} | ${sum(runs, (r) => r.retried)} |\n`);
    }
  } finally {
    await stopAll();
    // The runtime generation's volume was installed for this bench's prefix alone.
    const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.prefix}=${prefix}`] } });
    await Promise.all((Volumes ?? []).map((v) => docker.getVolume(v.Name).remove().catch(() => undefined)));
    await queue.close();
    await flows.close();
    await cleanup.close();
    await client.quit();
    await redis.stop();
    await rm(dir, { recursive: true, force: true });
  }
}

await main();
