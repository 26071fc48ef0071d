// One Harbor task run two ways in the same run: the way Harbor's local Docker environment runs a trial,
// and on the fleet. Harbor's way, per trial: a compose file for the task (service `main` built from
// environment/, `sleep infinity` as its command), `docker-compose build` (cached after the first),
// `down --remove-orphans` (Harbor clears a stale project first), `up -d`, the log folders made, the
// solution copied in and `(/solution/solve.sh) > /logs/agent/oracle.txt 2>&1` run through `exec -T main
// bash -c`, tests/ copied to /tests, `(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1`, the
// reward file copied out, `down`. The fleet's way: a batch of the same task folder with the oracle agent,
// enqueued to a worker in this process (a private Redis, as test/helpers/fleet.ts starts one), and its
// results awaited. Both sides must see reward 1 on every trial: a bench that times failures is worthless.
//
// Measured, once the image is built (one warm-up trial each side first):
// - latency at concurrency 1: N trials back to back, each its own compose project / its own one-episode
//   batch; p50 and mean of start -> reward read (compose) and enqueue -> result (fleet);
// - throughput at concurrency C: M trials, C at a time (compose) against one batch of M on a worker of
//   concurrency C; episodes per second;
// - a fresh environment's first episode: a copy of the task with a changed Dockerfile, so the fleet must
//   build it; enqueue -> result against that build's own time (the worker's 'environment image built'
//   log line), goal within build time + 10%. A direct `docker build` of another fresh copy is printed
//   beside it for scale (the legacy builder, as docker-compose 1.29 uses; the fleet's builder may differ).
//
// Differences from Harbor, all in Harbor's favour: `down` keeps the image (Harbor's default `--delete`
// runs `down --rmi all`, which makes the next trial build again); the log folders are made by an exec
// and the reward read with `docker cp` (Harbor bind-mounts host folders, which the fleet never does);
// compose 1.29 has no `up --wait` (the task has no healthcheck, so Harbor's wait would return at once).
// The engine here runs with --bridge=none: main gets `network_mode: none`, and with no service left on
// a network the project creates none. `down` waits out the 10 s stop timeout because `sleep infinity`
// as PID 1 ignores SIGTERM, as it does under Harbor: that is part of Harbor's trial, and printed apart.
//
// Run: npx tsx bench/harbor-trial.ts [--task test/fixtures/harbor/hello-file] [--c1 8] [--c4 16]
//   [--concurrency 4] [--pool 1] [--no-fresh] [--fresh-only] [--fresh-sleep-sec 0]
// --fresh-sleep-sec S: the fresh copy's added build step also sleeps S seconds, a stand-in for a build
// that does real work (apt-get, pip): the default step takes about a second, less than an episode.
// --pool N: warm sandboxes per kind in the fleet's worker (the CLI's default is 1; 0 = off).
// pytest-uvx is not a default: its verifier installs uv from the internet, which neither side has here.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';
import { FlowProducer } from 'bullmq';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import type { EpisodeResult } from '../src/episode/episode-job.ts';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { enqueueBatch } from '../src/producer/enqueue-batch.ts';
import { ResultsStore } from '../src/results/results-store.ts';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { LABEL } from '../src/sandbox/labels.ts';
import { loadBatch } from '../src/tasks/load-task.ts';
import { startWorker, type WorkerHandle } from '../src/worker/start-worker.ts';
import { intOption, poll } from './command-batch.ts';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
/** Its own prefix: a reaper of another fleet on the same engine must not take these sandboxes for orphans. */
const PREFIX = 'bench-harbor';
/**
 * The patched node and runtime volume the test suite's workers share (test/helpers/fleet.ts): a worker
 * with its own would install a 95 MB runtime first, which is set-up of the fleet, not of an episode.
 */
const RUNTIME_CACHE = path.join(os.tmpdir(), 'rf-test-runtime-cache');
const RUNTIME_SCOPE = 'rf-test-shared';

const { values } = parseArgs({
  options: {
    task: { type: 'string', default: path.join(ROOT, 'test/fixtures/harbor/hello-file') },
    c1: { type: 'string', default: '8' },
    c4: { type: 'string', default: '16' },
    concurrency: { type: 'string', default: '4' },
    pool: { type: 'string', default: '1' },
    'no-fresh': { type: 'boolean', default: false },
    'fresh-only': { type: 'boolean', default: false },
    'fresh-sleep-sec': { type: 'string', default: '0' },
  },
});
const TASK = path.resolve(values.task);
const c1Trials = intOption(values, 'c1');
const cNTrials = intOption(values, 'c4');
const concurrency = intOption(values, 'concurrency');
const pool = intOption(values, 'pool', 0);
const freshSleepSec = intOption(values, 'fresh-sleep-sec', 0);

const run = promisify(execFile);
const out = (line = '') => process.stdout.write(`${line}\n`);
const load = () => os.loadavg().map((l) => l.toFixed(1)).join(' ');
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
}
const ms = (x: number) => x.toFixed(0);

// ---------------------------------------------------------------------------------------------------
// Harbor's way: docker-compose per trial.

const COMPOSE_STEPS = ['build', 'down stale', 'up', 'logs dirs', 'cp solution', 'oracle exec', 'cp tests', 'verifier exec', 'cp reward', 'down'] as const;
type ComposeStep = (typeof COMPOSE_STEPS)[number];
interface ComposeTrial { ms: number; steps: Record<ComposeStep, number>; reward: string }

/** Harbor names the image after the environment: trials of one task share it, so builds after the first are cached. */
const imageName = (task: string) => `hb__${path.basename(task).toLowerCase().replace(/[^a-z0-9._-]/g, '-')}`;

async function composeTrial(task: string, scratch: string, project: string): Promise<ComposeTrial> {
  const dir = path.join(scratch, project);
  await mkdir(dir, { recursive: true });
  const file = path.join(dir, 'docker-compose.yaml');
  // JSON is YAML: no YAML writer needed. Limits as Harbor's base compose file sets them (cpus, memory).
  await writeFile(file, JSON.stringify({
    services: {
      main: {
        build: { context: path.join(task, 'environment') },
        image: imageName(task),
        command: ['sh', '-c', 'sleep infinity'],
        network_mode: 'none',
        cpus: 1,
        mem_limit: '1024m',
      },
    },
  }, null, 2));
  const compose = (...args: string[]) => run('docker-compose', ['-p', project, '-f', file, ...args], { maxBuffer: 64 * 1024 * 1024 });
  const steps = Object.fromEntries(COMPOSE_STEPS.map((s) => [s, 0])) as Record<ComposeStep, number>;
  const step = async <T>(name: ComposeStep, fn: () => Promise<T>): Promise<T> => {
    const s = performance.now();
    try {
      return await fn();
    } finally {
      steps[name] += performance.now() - s;
    }
  };
  const started = performance.now();
  let up = false;
  try {
    await step('build', () => compose('build'));
    await step('down stale', () => compose('down', '--remove-orphans'));
    up = true;
    await step('up', () => compose('up', '-d'));
    const container = (await compose('ps', '-q', 'main')).stdout.trim();
    if (container === '') throw new Error(`compose project ${project}: no container for service main after up`);
    await step('logs dirs', () => compose('exec', '-T', 'main', 'bash', '-c', 'mkdir -p /logs/agent /logs/verifier /logs/artifacts && chmod 777 /logs/agent /logs/verifier'));
    await step('cp solution', () => run('docker', ['cp', `${path.join(task, 'solution')}/.`, `${container}:/solution`]));
    await step('oracle exec', () => compose('exec', '-T', '-e', 'DEBIAN_FRONTEND=noninteractive', 'main', 'bash', '-c',
      'chmod +x /solution/solve.sh && (/solution/solve.sh) > /logs/agent/oracle.txt 2>&1'));
    await step('cp tests', () => run('docker', ['cp', `${path.join(task, 'tests')}/.`, `${container}:/tests`]));
    // The script's exit code is ignored, as Harbor ignores it: the reward file decides.
    await step('verifier exec', () => compose('exec', '-T', 'main', 'bash', '-c', 'chmod +x /tests/test.sh; (/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1').catch(() => undefined));
    const rewardFile = path.join(dir, 'reward.txt');
    await step('cp reward', () => run('docker', ['cp', `${container}:/logs/verifier/reward.txt`, rewardFile]));
    const reward = (await readFile(rewardFile, 'utf8')).trim();
    if (Number(reward) !== 1) throw new Error(`compose trial ${project}: reward.txt says ${JSON.stringify(reward)}, expected 1 (the oracle should pass)`);
    await step('down', () => compose('down'));
    up = false;
    return { ms: performance.now() - started, steps, reward };
  } finally {
    if (up) await compose('down', '--remove-orphans').catch(() => undefined);
  }
}

async function composeRun(task: string, scratch: string, tag: string, trials: number, at: number): Promise<{ seconds: number; trials: ComposeTrial[] }> {
  let next = 0;
  const done: ComposeTrial[] = [];
  const started = performance.now();
  await Promise.all(Array.from({ length: at }, async () => {
    while (next < trials) {
      const n = next++;
      done.push(await composeTrial(task, scratch, `hb-${tag}-${n}`));
    }
  }));
  return { seconds: (performance.now() - started) / 1000, trials: done };
}

// ---------------------------------------------------------------------------------------------------
// The fleet: a worker in this process on a private Redis.

interface Fleet {
  client: Redis;
  flows: FlowProducer;
  results: ResultsStore;
  dataDir: string;
  redisUrl: string;
  /** Build times the workers logged ('environment image built'), in order. */
  builds: number[];
}

const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');

function fleetLog(builds: number[]) {
  // Info lines are read for the build's own time; warnings and errors are shown.
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString().split('\n').filter(Boolean)) {
        try {
          const rec = JSON.parse(line) as { level: number; msg?: string; buildMs?: number };
          if (rec.msg === 'environment image built' && typeof rec.buildMs === 'number') builds.push(rec.buildMs);
          if (rec.level >= 40) process.stderr.write(`${line}\n`);
        } catch {
          process.stderr.write(`${line}\n`);
        }
      }
      cb();
    },
  });
  return pino({ level: 'info' }, stream);
}

async function startFleetWorker(f: Fleet, id: string, slots: number): Promise<WorkerHandle> {
  return startWorker({
    redisUrl: f.redisUrl, prefix: PREFIX, dataDir: f.dataDir, docker, log: fleetLog(f.builds),
    workerId: id, concurrency: slots, sandboxPool: pool, callTimeoutMs: 30_000, outputCapBytes: 64 * 1024,
    runtimeCacheDir: RUNTIME_CACHE, runtimeVolumeScope: RUNTIME_SCOPE,
  });
}

interface FleetBatch { seconds: number; removedSeconds: number; results: EpisodeResult[] }

/** A batch of `samples` oracle episodes of the task: enqueue -> every result, checked, then every sandbox removed. */
async function fleetBatch(f: Fleet, task: string, name: string, samples: number): Promise<FleetBatch> {
  const file = path.join(f.dataDir, `${name}.yaml`);
  await writeFile(file, `name: ${name}\ntasks: [${JSON.stringify(task)}]\nagent: { kind: oracle }\nsamples: ${samples}\n`);
  const batch = await loadBatch(file);
  const started = performance.now();
  const plan = await enqueueBatch(batch, { flows: f.flows, redis: f.client, prefix: PREFIX, results: f.results });
  await poll(`${samples} results of ${name}`, 900_000, async () => (await f.results.resultCount(plan.batchId)) >= samples, 5);
  const seconds = (performance.now() - started) / 1000;
  const results = await f.results.results(plan.batchId);
  const bad = results.filter((r) => r.status !== 'passed' || r.reward !== 1);
  if (bad.length > 0) throw new Error(`${bad.length} of ${samples} fleet episodes of ${name} did not pass with reward 1: ${JSON.stringify(bad[0])}`);
  await poll(`sandboxes of ${name} to be removed`, 120_000, async () =>
    (await docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } })).length === 0, 20);
  return { seconds, removedSeconds: (performance.now() - started) / 1000, results };
}

// ---------------------------------------------------------------------------------------------------

/** A copy of the task whose Dockerfile gained a line: content no engine has built. */
async function freshCopy(scratch: string, name: string, mark: string): Promise<string> {
  const task = path.join(scratch, name);
  await cp(TASK, task, { recursive: true });
  const dockerfile = path.join(task, 'environment', 'Dockerfile');
  const work = freshSleepSec > 0 ? ` && sleep ${freshSleepSec}` : '';
  await writeFile(dockerfile, `${await readFile(dockerfile, 'utf8')}RUN echo ${mark} > /etc/bench-mark${work}\n`);
  return task;
}

interface Timed {
  composeMs: number[];
  composeTrials: ComposeTrial[];
  fleetMs: number[];
  fleetRemovedMs: number[];
  fleetResults: EpisodeResult[];
  composeN: { seconds: number; trials: ComposeTrial[] };
  fleetN: FleetBatch;
  composePerSec: number;
  fleetPerSec: number;
  loads: { c1: string; c1End: string; cN: string; cNEnd: string };
}

/** Warm-up, latency at concurrency 1 and throughput at concurrency C, both sides, on the task as it is. */
async function timedRuns(f: Fleet, scratch: string, runId: string): Promise<Timed> {
  // Warm-up, not timed: the image built once each side, the worker's runtime ready.
  const warmCompose = await composeRun(TASK, scratch, `warm-${runId}`, 1, 1);
  out(`warm-up: compose trial ${ms(warmCompose.trials[0]!.ms)} ms (build ${ms(warmCompose.trials[0]!.steps.build)} ms)`);
  let worker = await startFleetWorker(f, `harbor-c1-${runId}`, 1);
  try {
    const warmFleet = await fleetBatch(f, TASK, `warm-${runId}`, 1);
    out(`warm-up: fleet episode ${ms(warmFleet.seconds * 1000)} ms`);

    // Concurrency 1: back to back, compose and fleet alternating so both meet the same load.
    const composeMs: number[] = [];
    const composeTrials: ComposeTrial[] = [];
    const fleetMs: number[] = [];
    const fleetRemovedMs: number[] = [];
    const fleetResults: EpisodeResult[] = [];
    const c1 = load();
    for (let i = 0; i < c1Trials; i++) {
      const composeOne = async () => {
        const t = (await composeRun(TASK, scratch, `c1-${runId}-${i}`, 1, 1)).trials[0]!;
        composeMs.push(t.ms);
        composeTrials.push(t);
      };
      const fleetOne = async () => {
        const b = await fleetBatch(f, TASK, `c1-${runId}-${i}`, 1);
        fleetMs.push(b.seconds * 1000);
        fleetRemovedMs.push(b.removedSeconds * 1000);
        fleetResults.push(...b.results);
      };
      for (const one of i % 2 === 0 ? [composeOne, fleetOne] : [fleetOne, composeOne]) await one();
    }
    await worker.close();
    const c1End = load();

    // Concurrency C: compose C trials at a time against one batch on a worker of concurrency C.
    worker = await startFleetWorker(f, `harbor-c${concurrency}-${runId}`, concurrency);
    await fleetBatch(f, TASK, `warm-c${concurrency}-${runId}`, concurrency);
    const cN = load();
    const composeN = await composeRun(TASK, scratch, `cn-${runId}`, cNTrials, concurrency);
    const fleetN = await fleetBatch(f, TASK, `cn-${runId}`, cNTrials);
    return {
      composeMs, composeTrials, fleetMs, fleetRemovedMs, fleetResults, composeN, fleetN,
      composePerSec: cNTrials / composeN.seconds, fleetPerSec: cNTrials / fleetN.seconds,
      loads: { c1, c1End, cN, cNEnd: load() },
    };
  } finally {
    await worker.close();
  }
}

function printTimed(t: Timed): void {
  const { composeMs, composeTrials, fleetMs, fleetRemovedMs, fleetResults, composeN, fleetN } = t;
  const fleetTotal = fleetResults.map((r) => r.timings.totalMs);
  out(`\nconcurrency 1: ${c1Trials} trials each side, back to back, alternating; load ${t.loads.c1} -> ${t.loads.c1End}`);
  out(`  compose: p50 ${ms(quantile(composeMs, 0.5))} ms, mean ${ms(mean(composeMs))} ms, p90 ${ms(quantile(composeMs, 0.9))} ms (start -> reward read -> down done)`);
  out(`    p50 ms per step: ${COMPOSE_STEPS.map((s) => `${s} ${ms(quantile(composeTrials.map((x) => x.steps[s]), 0.5))}`).join(', ')}`);
  const composeNoDown = composeTrials.map((x) => x.ms - x.steps.down);
  out(`    without the final down (reward in hand): p50 ${ms(quantile(composeNoDown, 0.5))} ms, mean ${ms(mean(composeNoDown))} ms`);
  out(`  fleet:   p50 ${ms(quantile(fleetMs, 0.5))} ms, mean ${ms(mean(fleetMs))} ms, p90 ${ms(quantile(fleetMs, 0.9))} ms (enqueue -> result); `
    + `to its sandbox removed p50 ${ms(quantile(fleetRemovedMs, 0.5))} ms; the episode itself (result.timings.totalMs) p50 ${ms(quantile(fleetTotal, 0.5))} ms`);
  for (const k of ['setupMs', 'agentMs', 'verifyMs', 'closeMs'] as const) {
    const xs = fleetResults.flatMap((r) => (r.timings[k] === undefined ? [] : [r.timings[k]!]));
    if (xs.length > 0) out(`    ${k} p50 ${ms(quantile(xs, 0.5))} ms`);
  }
  out(`\nconcurrency ${concurrency}: ${cNTrials} trials each side; load ${t.loads.cN} -> ${t.loads.cNEnd}`);
  out(`  compose: ${composeN.seconds.toFixed(1)} s, ${t.composePerSec.toFixed(3)} episodes/s; trial p50 ${ms(quantile(composeN.trials.map((x) => x.ms), 0.5))} ms`);
  out(`  fleet:   ${fleetN.seconds.toFixed(1)} s enqueue -> last result (${fleetN.removedSeconds.toFixed(1)} s to every sandbox removed), ${t.fleetPerSec.toFixed(3)} episodes/s; `
    + `episode p50 ${ms(quantile(fleetN.results.map((r) => r.timings.totalMs), 0.5))} ms`);
}

async function main(): Promise<void> {
  const runId = randomBytes(4).toString('hex');
  const scratch = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-harbor-'));
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench-harbor' });
  const f: Fleet = {
    client, redisUrl: redis.url, dataDir: path.join(scratch, 'data'), builds: [],
    flows: new FlowProducer({ connection: client, prefix: PREFIX }),
    results: new ResultsStore(client, PREFIX, path.join(scratch, 'data')),
  };
  await mkdir(f.dataDir, { recursive: true });
  const images = new Set<string>();
  let worker: WorkerHandle | undefined;
  try {
    const running = (await docker.listContainers()).length;
    out(`bench: task ${path.relative(ROOT, TASK) || TASK}, ${os.cpus().length} cores, load ${load()}, ${running} running containers on the engine (a shared host); fleet pool ${pool}`);
    images.add(imageName(TASK));

    const timed = values['fresh-only'] ? undefined : await timedRuns(f, scratch, runId);

    // A fresh environment: the fleet builds it for its first episode.
    let fresh: { fleetMs: number; timings: EpisodeResult['timings'] | undefined; buildMs: number | undefined; dockerBuildMs: number; composeFreshMs: number; composeBuildMs: number } | undefined;
    if (!values['no-fresh']) {
      const fleetTask = await freshCopy(scratch, 'fresh-fleet', `fleet-${runId}`);
      const buildTask = await freshCopy(scratch, 'fresh-build', `build-${runId}`);
      const composeTask = await freshCopy(scratch, 'fresh-compose', `compose-${runId}`);
      const direct = `bench-harbor-fresh:${runId}`;
      images.add(direct);
      images.add(imageName(composeTask));
      worker = await startFleetWorker(f, `harbor-fresh-${runId}`, 1);
      const buildsBefore = f.builds.length;
      const b = await fleetBatch(f, fleetTask, `fresh-${runId}`, 1);
      await worker.close();
      worker = undefined;
      const s = performance.now();
      await run('docker', ['build', '--network', 'none', '-q', '-t', direct, path.join(buildTask, 'environment')]);
      const dockerBuildMs = performance.now() - s;
      const c = (await composeRun(composeTask, scratch, `fresh-${runId}`, 1, 1)).trials[0]!;
      fresh = { fleetMs: b.seconds * 1000, timings: b.results[0]?.timings, buildMs: f.builds[buildsBefore], dockerBuildMs, composeFreshMs: c.ms, composeBuildMs: c.steps.build };
      const digest = b.results[0]?.provenance.environment?.digest;
      if (digest) images.add(`rollout-fleet/env:${digest.slice(0, 24)}`);
    }

    // ---------------------------------------------------------------------------------------------
    if (timed) printTimed(timed);
    if (fresh) {
      out(`\nfresh environment (a changed Dockerfile${freshSleepSec > 0 ? `, its added step sleeping ${freshSleepSec} s` : ''}), first episode:`);
      out(`  fleet: enqueue -> result ${ms(fresh.fleetMs)} ms; its build ${fresh.buildMs === undefined ? 'not logged' : `${ms(fresh.buildMs)} ms`} (the worker's log); `
        + `a direct docker build of another fresh copy ${ms(fresh.dockerBuildMs)} ms`);
      if (fresh.buildMs !== undefined) {
        out(`  fleet: first episode - its build = ${ms(fresh.fleetMs - fresh.buildMs)} ms${timed ? ` (a warm episode: p50 ${ms(quantile(timed.fleetMs, 0.5))} ms)` : ''}`);
        // Where the rest went: set-up runs from pick-up and includes the wait for the build.
        const t = fresh.timings;
        if (t) out(`  fleet: its timings ms: ${Object.entries(t).filter(([, v]) => typeof v === 'number').map(([k, v]) => `${k} ${ms(v as number)}`).join(', ')}`);
      }
      out(`  compose: fresh trial ${ms(fresh.composeFreshMs)} ms, of which build ${ms(fresh.composeBuildMs)} ms`);
    }

    out('\nsummary (compose = Harbor\'s local Docker trial; higher ratio = fleet faster):');
    out('  measure                          compose        fleet        ratio   goal');
    const row = (m: string, c: string, fl: string, r: string, g: string) => out(`  ${m.padEnd(31)} ${c.padStart(9)} ${fl.padStart(12)} ${r.padStart(12)}   ${g}`);
    if (timed) {
      const { composeMs, fleetMs, composePerSec, fleetPerSec } = timed;
      const p50Ratio = quantile(composeMs, 0.5) / quantile(fleetMs, 0.5);
      const meanRatio = mean(composeMs) / mean(fleetMs);
      const rateRatio = fleetPerSec / composePerSec;
      row('c=1 per episode p50 (ms)', ms(quantile(composeMs, 0.5)), ms(quantile(fleetMs, 0.5)), `${p50Ratio.toFixed(1)}x`, `>= 5x: ${p50Ratio >= 5 ? 'met' : 'NOT met'}`);
      row('c=1 per episode mean (ms)', ms(mean(composeMs)), ms(mean(fleetMs)), `${meanRatio.toFixed(1)}x`, `>= 5x: ${meanRatio >= 5 ? 'met' : 'NOT met'}`);
      row(`c=${concurrency} throughput (episodes/s)`, composePerSec.toFixed(3), fleetPerSec.toFixed(3), `${rateRatio.toFixed(1)}x`, '');
    }
    if (fresh) {
      const ref = fresh.buildMs ?? fresh.dockerBuildMs;
      const over = fresh.fleetMs / ref;
      row('fresh env first episode (ms)', ms(fresh.composeFreshMs), ms(fresh.fleetMs), `${over.toFixed(2)}x build`,
        `<= 1.10x build (${ms(ref)} ms${fresh.buildMs === undefined ? ', direct docker build' : ''}): ${over <= 1.1 ? 'met' : 'NOT met'}`);
    }
    out(`\nload at the end: ${load()}`);
  } finally {
    await worker?.close().catch(() => undefined);
    await f.flows.close();
    await client.quit();
    await redis.stop();
    const left = await docker.listContainers({ all: true, filters: { label: [`${LABEL.fleet}=${PREFIX}`] } }).catch(() => []);
    await Promise.all(left.map((c) => docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined)));
    // The images this run made (the fleet's own for the fresh copy, compose's, the direct build); the
    // warm task's fleet image is left for the fleet's own pruning, as any built environment is.
    for (const image of images) await docker.getImage(image).remove({ force: true }).catch(() => undefined);
    await rm(scratch, { recursive: true, force: true });
  }
}

await main();
