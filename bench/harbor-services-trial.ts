// A Harbor task with two services (test/fixtures/harbor-services/api-sidecar: main, and an api sidecar
// with a healthcheck main waits for) run two ways in the same run, the oracle on both, reward 1 checked
// on every trial. Harbor's way, per trial, as its local Docker environment runs a task with an
// environment/docker-compose.yaml: the task's compose file merged over Harbor's base service `main`
// (built from environment/, `sleep infinity`, the task's cpus and memory), `docker-compose build`
// (cached after the first), `down --remove-orphans` of a stale project, `up -d` (which starts api,
// waits for its healthcheck, then starts main), /logs made, the solution copied in and run with
// `exec -T main bash -c`, tests/ copied to /tests and test.sh run, reward.txt copied out, `down`
// (both containers and the project's volumes and network). The fleet's way: the same task folder
// enqueued as one-episode batches back to back to a worker in this process (a private Redis), its
// environment built once before the timed trials.
//
// This engine runs with --bridge=none, so compose's default network is not used: api gets
// `network_mode: none` and `extra_hosts` naming api and main as 127.0.0.1, and main joins api's
// namespace (`network_mode: service:api`), which is how the fleet joins them too (one namespace per
// episode). Everything else is Harbor's sequence; `down` waits out the 10 s stop timeout because
// `sleep infinity` (main) and python (api) as PID 1 ignore SIGTERM, as they do under Harbor: printed
// apart. The docker-compose here is 1.29 (no `up --wait`; depends_on service_healthy makes `up` wait).
//
// Run: npx tsx bench/harbor-services-trial.ts [--trials 5] [--task test/fixtures/harbor-services/api-sidecar]
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';
import { FlowProducer } from 'bullmq';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { parse as parseYaml } from 'yaml';
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
const PREFIX = 'bench-harbor-services';
/** The runtime the test suite's workers share (test/helpers/fleet.ts): installing one is not an episode's cost. */
const RUNTIME_CACHE = path.join(os.tmpdir(), 'rf-test-runtime-cache');
const RUNTIME_SCOPE = 'rf-test-shared';

const { values } = parseArgs({
  options: {
    task: { type: 'string', default: path.join(ROOT, 'test/fixtures/harbor-services/api-sidecar') },
    trials: { type: 'string', default: '5' },
  },
});
const TASK = path.resolve(values.task);
const TRIALS = intOption(values, 'trials');

const run = promisify(execFile);
const out = (line = '') => process.stdout.write(`${line}\n`);
const load = () => os.loadavg().map((l) => l.toFixed(1)).join(' ');
const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
function quantile(xs: number[], q: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]!;
}
const ms = (x: number) => x.toFixed(0);
const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');

// ---------------------------------------------------------------------------------------------------
// Harbor's way: docker-compose per trial.

const STEPS = ['build', 'down stale', 'up', 'logs dirs', 'cp solution', 'oracle exec', 'cp tests', 'verifier exec', 'cp reward', 'down'] as const;
type Step = (typeof STEPS)[number];
interface ComposeTrial { ms: number; steps: Record<Step, number> }

const imageName = (task: string) => `hb__${path.basename(task).toLowerCase().replace(/[^a-z0-9._-]/g, '-')}`;

/** The task's compose file merged over Harbor's base `main`, networking as this engine allows (see the top). */
async function mergedCompose(task: string): Promise<string> {
  const toml = await readFile(path.join(task, 'task.toml'), 'utf8');
  const cpus = Number(/^cpus\s*=\s*([\d.]+)/m.exec(toml)?.[1] ?? 1);
  const memoryMb = Number(/^memory_mb\s*=\s*(\d+)/m.exec(toml)?.[1] ?? 1024);
  const env = path.join(task, 'environment');
  const theirs = parseYaml(await readFile(path.join(env, 'docker-compose.yaml'), 'utf8')) as { services: Record<string, Record<string, unknown>>; volumes?: unknown };
  const services: Record<string, Record<string, unknown>> = {};
  const others = Object.keys(theirs.services).filter((s) => s !== 'main');
  if (others.length !== 1) throw new Error(`${task}: this bench runs a task with one service beside main, found ${others.length}`);
  const [sidecar] = others as [string];
  for (const [name, svc] of Object.entries(theirs.services)) {
    const own = { ...svc };
    // Paths of the task's compose file are relative to environment/, as Harbor resolves them.
    if (typeof own.build === 'object' && own.build !== null) own.build = { ...own.build, context: path.resolve(env, String((own.build as { context?: string }).context ?? '.')) };
    services[name] = own;
  }
  services.main = {
    build: { context: env }, image: imageName(task), command: ['sh', '-c', 'sleep infinity'], cpus, mem_limit: `${memoryMb}m`,
    ...services.main,
    network_mode: `service:${sidecar}`,
  };
  services[sidecar] = { cpus, mem_limit: `${memoryMb}m`, ...services[sidecar], network_mode: 'none', extra_hosts: [`${sidecar}:127.0.0.1`, 'main:127.0.0.1'] };
  // JSON is YAML.
  return JSON.stringify({ version: '2.4', services, ...(theirs.volumes !== undefined && { volumes: theirs.volumes }) }, null, 2);
}

async function composeTrial(task: string, compose: string, scratch: string, project: string): Promise<ComposeTrial> {
  const dir = path.join(scratch, project);
  await mkdir(dir, { recursive: true });
  const file = path.join(dir, 'docker-compose.yaml');
  await writeFile(file, compose);
  const dc = (...args: string[]) => run('docker-compose', ['-p', project, '-f', file, ...args], { maxBuffer: 64 * 1024 * 1024 });
  const steps = Object.fromEntries(STEPS.map((s) => [s, 0])) as Record<Step, number>;
  const step = async <T>(name: Step, fn: () => Promise<T>): Promise<T> => {
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
    await step('build', () => dc('build'));
    await step('down stale', () => dc('down', '--remove-orphans', '--volumes'));
    up = true;
    await step('up', () => dc('up', '-d'));
    const container = (await dc('ps', '-q', 'main')).stdout.trim();
    if (container === '') throw new Error(`compose project ${project}: no container for service main after up`);
    await step('logs dirs', () => dc('exec', '-T', 'main', 'bash', '-c', 'mkdir -p /logs/agent /logs/verifier /logs/artifacts && chmod 777 /logs/agent /logs/verifier'));
    await step('cp solution', () => run('docker', ['cp', `${path.join(task, 'solution')}/.`, `${container}:/solution`]));
    await step('oracle exec', () => dc('exec', '-T', '-e', 'DEBIAN_FRONTEND=noninteractive', 'main', 'bash', '-c',
      'chmod +x /solution/solve.sh && (/solution/solve.sh) > /logs/agent/oracle.txt 2>&1'));
    await step('cp tests', () => run('docker', ['cp', `${path.join(task, 'tests')}/.`, `${container}:/tests`]));
    await step('verifier exec', () => dc('exec', '-T', 'main', 'bash', '-c', 'chmod +x /tests/test.sh; (/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1').catch(() => undefined));
    const rewardFile = path.join(dir, 'reward.txt');
    await step('cp reward', () => run('docker', ['cp', `${container}:/logs/verifier/reward.txt`, rewardFile]));
    const reward = (await readFile(rewardFile, 'utf8')).trim();
    if (Number(reward) !== 1) throw new Error(`compose trial ${project}: reward.txt says ${JSON.stringify(reward)}, expected 1 (the oracle should pass)`);
    await step('down', () => dc('down', '--volumes'));
    up = false;
    return { ms: performance.now() - started, steps };
  } finally {
    if (up) await dc('down', '--remove-orphans', '--volumes').catch(() => undefined);
  }
}

// ---------------------------------------------------------------------------------------------------
// The fleet: a worker in this process on a private Redis.

function quietLog() {
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      for (const line of chunk.toString().split('\n').filter(Boolean)) {
        try {
          if ((JSON.parse(line) as { level: number }).level >= 40) process.stderr.write(`${line}\n`);
        } catch {
          process.stderr.write(`${line}\n`);
        }
      }
      cb();
    },
  });
  return pino({ level: 'warn' }, stream);
}

interface Fleet { client: Redis; flows: FlowProducer; results: ResultsStore; dataDir: string }

/** One oracle episode of the task as its own batch: enqueue -> result (checked), then until its environment is removed. */
async function fleetEpisode(f: Fleet, name: string): Promise<{ ms: number; removedMs: number; result: EpisodeResult }> {
  const file = path.join(f.dataDir, `${name}.yaml`);
  await writeFile(file, `name: ${name}\ntasks: [${JSON.stringify(TASK)}]\nagent: { kind: oracle }\n`);
  const batch = await loadBatch(file);
  const started = performance.now();
  const plan = await enqueueBatch(batch, { flows: f.flows, redis: f.client, prefix: PREFIX, results: f.results });
  await poll(`the result of ${name}`, 600_000, async () => (await f.results.resultCount(plan.batchId)) >= 1, 5);
  const elapsed = performance.now() - started;
  const [result] = await f.results.results(plan.batchId);
  if (result?.status !== 'passed' || result.reward !== 1) throw new Error(`fleet episode ${name} did not pass with reward 1: ${JSON.stringify(result)}`);
  await poll(`the environment of ${name} to be removed`, 120_000, async () =>
    (await docker.listContainers({ all: true, filters: { label: [`${LABEL.batch}=${plan.batchId}`] } })).length === 0, 20);
  return { ms: elapsed, removedMs: performance.now() - started, result };
}

// ---------------------------------------------------------------------------------------------------

async function main(): Promise<void> {
  const runId = randomBytes(4).toString('hex');
  const scratch = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-services-'));
  const redis = await startPrivateRedis();
  const client = new Redis(redis.url, { maxRetriesPerRequest: null, connectionName: 'rf-bench-services' });
  const f: Fleet = { client, dataDir: path.join(scratch, 'data'), flows: new FlowProducer({ connection: client, prefix: PREFIX }), results: new ResultsStore(client, PREFIX, path.join(scratch, 'data')) };
  await mkdir(f.dataDir, { recursive: true });
  let worker: WorkerHandle | undefined;
  try {
    out(`bench: task ${path.relative(ROOT, TASK) || TASK} (main + 1 service), ${TRIALS} trials each side at concurrency 1, ${os.cpus().length} cores, load ${load()}, `
      + `${(await docker.listContainers()).length} running containers on the engine (a shared host)`);
    const compose = await mergedCompose(TASK);
    worker = await startWorker({
      redisUrl: redis.url, prefix: PREFIX, dataDir: f.dataDir, docker, log: quietLog(), workerId: `bench-services-${runId}`,
      concurrency: 1, sandboxPool: 0, callTimeoutMs: 30_000, outputCapBytes: 64 * 1024, runtimeCacheDir: RUNTIME_CACHE, runtimeVolumeScope: RUNTIME_SCOPE,
    });
    // Warm-up, not timed: the images built once each side (compose's and the fleet's), the worker's runtime ready.
    const warmCompose = await composeTrial(TASK, compose, scratch, `hbs-warm-${runId}`);
    out(`warm-up: compose trial ${ms(warmCompose.ms)} ms (build ${ms(warmCompose.steps.build)} ms)`);
    const warmFleet = await fleetEpisode(f, `warm-${runId}`);
    out(`warm-up: fleet episode ${ms(warmFleet.ms)} ms`);

    const composeTrials: ComposeTrial[] = [];
    const fleet: Awaited<ReturnType<typeof fleetEpisode>>[] = [];
    const loadStart = load();
    for (let i = 0; i < TRIALS; i++) {
      // Alternating, so both sides meet the same load.
      const c = async () => {
        const t = await composeTrial(TASK, compose, scratch, `hbs-${runId}-${i}`);
        composeTrials.push(t);
        out(`  compose trial ${i + 1}: ${ms(t.ms)} ms (up ${ms(t.steps.up)}, oracle ${ms(t.steps['oracle exec'])}, verifier ${ms(t.steps['verifier exec'])}, down ${ms(t.steps.down)})`);
      };
      const fl = async () => {
        const e = await fleetEpisode(f, `t-${runId}-${i}`);
        fleet.push(e);
        const t = e.result.timings;
        out(`  fleet episode ${i + 1}: ${ms(e.ms)} ms enqueue -> result (set-up ${ms(t.setupMs ?? 0)}, agent ${ms(t.agentMs ?? 0)}, verify ${ms(t.verifyMs ?? 0)}); environment removed at ${ms(e.removedMs)} ms`);
      };
      for (const one of i % 2 === 0 ? [c, fl] : [fl, c]) await one();
    }
    const composeMs = composeTrials.map((t) => t.ms);
    const composeNoDown = composeTrials.map((t) => t.ms - t.steps.down);
    const fleetMs = fleet.map((e) => e.ms);
    const fleetRemovedMs = fleet.map((e) => e.removedMs);
    out(`\nload ${loadStart} -> ${load()}`);
    out(`compose p50 ms per step: ${STEPS.map((s) => `${s} ${ms(quantile(composeTrials.map((x) => x.steps[s]), 0.5))}`).join(', ')}`);
    out('\nsummary (compose = Harbor\'s local Docker trial of a task with services; higher ratio = fleet faster):');
    out('  measure                                    compose      fleet    ratio   goal');
    const row = (m: string, c: number, fl: number, goal: boolean) =>
      out(`  ${m.padEnd(42)} ${ms(c).padStart(7)} ${ms(fl).padStart(10)} ${`${(c / fl).toFixed(1)}x`.padStart(8)}   ${goal ? `>= 4x: ${c / fl >= 4 ? 'met' : 'NOT met'}` : ''}`);
    row('per episode p50 (ms)', quantile(composeMs, 0.5), quantile(fleetMs, 0.5), true);
    row('per episode mean (ms)', mean(composeMs), mean(fleetMs), true);
    row('to the reward, p50 (compose without down)', quantile(composeNoDown, 0.5), quantile(fleetMs, 0.5), false);
    row('until nothing is left, p50', quantile(composeMs, 0.5), quantile(fleetRemovedMs, 0.5), false);
  } finally {
    await worker?.close().catch(() => undefined);
    await f.flows.close();
    await client.quit();
    await redis.stop();
    const left = await docker.listContainers({ all: true, filters: { label: [`${LABEL.fleet}=${PREFIX}`] } }).catch(() => []);
    await Promise.all(left.map((c) => docker.getContainer(c.Id).remove({ force: true }).catch(() => undefined)));
    const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.fleet}=${PREFIX}`] } }).catch(() => ({ Volumes: [] }));
    await Promise.all((Volumes ?? []).map((v) => docker.getVolume(v.Name).remove().catch(() => undefined)));
    await docker.getImage(imageName(TASK)).remove({ force: true }).catch(() => undefined);
    await rm(scratch, { recursive: true, force: true });
  }
}

await main();
