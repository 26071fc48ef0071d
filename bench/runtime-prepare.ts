// Benchmark of runtime generations, measured side by side in one run (absolute times are noisy on
// shared 2-core machines; ratios are what to compare):
//   cold prepareRuntime of the full runtime vs `tar -c <folder> | docker cp - <container>:<mount>`
//   warm prepareRuntime (this process saw the volume ready; and the first check of a fresh process)
//   event-loop delay p99 while the cold build (hash + archive to a discarding sink) runs in the builder
//   thread vs on the main thread, and during the cold preparations themselves (build + upload)
// Run: npx tsx bench/runtime-prepare.ts   (BENCH_ROUNDS=5 for more rounds; needs dockerd and the busybox image)
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { copyFile, mkdir, mkdtemp, rm, writeFile, chmod } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { Redis } from 'ioredis';
import { pino } from 'pino';
import { startPrivateRedis } from '../src/cli/private-redis.ts';
import { hashRuntimeInputs, runtimeArchive } from '../src/runtime/build-archive.ts';
import { stopRuntimeBuilder } from '../src/runtime/build-off-thread.ts';
import { forgetRuntimeCaches, prepareRuntime, type RuntimeGeneration } from '../src/runtime/prepare-runtime.ts';
import { defaultRuntimeInputs, RUNTIME_MOUNT_PATH, type RuntimeInputs } from '../src/runtime/runtime-inputs.ts';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { LABEL } from '../src/sandbox/labels.ts';
import { DEFAULT_IMAGE } from '../src/tasks/task-spec.ts';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const WARM_CALLS = 200;
const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
const log = pino({ level: process.env.LOG_LEVEL ?? 'warn' });

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((xs.length * p) / 100))]!;
const ms = (x: number) => `${x.toFixed(x < 10 ? 2 : 0)} ms`;

/** The runtime as a plain folder, for the baseline. */
async function materialise(inputs: RuntimeInputs): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-runtime-'));
  for (const input of inputs) {
    const dest = path.join(dir, input.path);
    await mkdir(path.dirname(dest), { recursive: true });
    if ('source' in input) await copyFile(input.source, dest);
    else await writeFile(dest, input.content);
    await chmod(dest, input.mode);
  }
  return dir;
}

interface Timed {
  ms: number;
  /** CPU time of the process(es) doing the work (ours: this process, all threads; baseline: tar and docker). */
  cpuMs: number;
}

/** Runs `sh -c script` under GNU time when the machine has it, for the children's CPU time. */
const TIME_BIN = '/usr/bin/time';

/** `tar -c folder | docker cp - container:mount` into a created (never started) container; only the copy is timed. */
async function baselineCopy(dir: string, round: number): Promise<Timed> {
  const volume = `rf-bench-${process.pid}-${round}`;
  await docker.createVolume({ Name: volume, Labels: { [LABEL.managed]: '1', 'rollout-fleet.bench': String(process.pid) } });
  const container = await docker.createContainer({
    Image: DEFAULT_IMAGE,
    Cmd: ['true'],
    Labels: { 'rollout-fleet.bench': String(process.pid) },
    HostConfig: { NetworkMode: 'none', Mounts: [{ Type: 'volume', Source: volume, Target: RUNTIME_MOUNT_PATH }] },
  });
  try {
    const started = performance.now();
    const script = ['sh', '-c', `tar -C "$1" -c . | docker cp - "$2:${RUNTIME_MOUNT_PATH}" 2>/dev/null`, 'sh', dir, container.id];
    const child = spawn(TIME_BIN, ['-f', '%U %S', ...script], { stdio: ['ignore', 'inherit', 'pipe'] });
    let timeOut = '';
    child.stderr.on('data', (d: Buffer) => (timeOut += d.toString()));
    const [code] = (await once(child, 'exit')) as [number];
    const ms = performance.now() - started;
    if (code !== 0) throw new Error(`tar | docker cp exited ${code}: ${timeOut}`);
    const [user, sys] = timeOut.trim().split('\n').at(-1)!.split(' ').map(Number);
    return { ms, cpuMs: ((user ?? 0) + (sys ?? 0)) * 1000 };
  } finally {
    await container.remove({ force: true });
    await docker.getVolume(volume).remove();
  }
}

/** A cold preparation as a new worker process would see it, with the event-loop delay p99 during it. */
async function coldPrepare(redis: Redis, inputs: RuntimeInputs, round: number): Promise<{ gen: RuntimeGeneration; loopP99: number; cpuMs: number }> {
  forgetRuntimeCaches();
  await stopRuntimeBuilder();
  const h = monitorEventLoopDelay({ resolution: 1 });
  h.enable();
  const cpu = process.cpuUsage();
  const gen = await prepareRuntime({ docker, redis, prefix: `bench${process.pid}r${round}`, log }, inputs);
  const used = process.cpuUsage(cpu);
  h.disable();
  return { gen, loopP99: h.percentile(99) / 1e6, cpuMs: (used.user + used.system) / 1000 };
}

/** Event-loop delay p99 and max (ms) while hash + archive of the inputs run to a discarding sink. */
async function loopDelayDuringBuild(inputs: RuntimeInputs, onMainThread: boolean): Promise<{ p99: number; max: number; buildMs: number }> {
  await stopRuntimeBuilder();
  const h = monitorEventLoopDelay({ resolution: 1 });
  h.enable();
  const started = performance.now();
  const hashed = await hashRuntimeInputs(inputs, { onMainThread });
  const archive = runtimeArchive(inputs, hashed, { onMainThread });
  await pipeline(archive.stream, new Writable({ write: (_c, _e, cb) => cb() }));
  const buildMs = performance.now() - started;
  h.disable();
  return { p99: h.percentile(99) / 1e6, max: h.max / 1e6, buildMs };
}

async function main(): Promise<void> {
  const redisServer = await startPrivateRedis();
  const redis = new Redis(redisServer.url, { maxRetriesPerRequest: null });
  const inputs = await defaultRuntimeInputs();
  const folder = await materialise(inputs);
  const toRemove: string[] = [];
  try {
    const baseline: number[] = [];
    const baselineCpu: number[] = [];
    const cold: RuntimeGeneration[] = [];
    const coldCpu: number[] = [];
    const coldLoop: number[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      // Alternate the order so neither side always runs on a warmer page cache or a calmer machine.
      const first = round % 2 === 0 ? 'baseline' : 'cold';
      for (const which of first === 'baseline' ? ['baseline', 'cold'] : ['cold', 'baseline']) {
        if (which === 'baseline') {
          const { ms: copyMs, cpuMs } = await baselineCopy(folder, round);
          baseline.push(copyMs);
          baselineCpu.push(cpuMs);
        } else {
          const { gen, loopP99, cpuMs } = await coldPrepare(redis, inputs, round);
          toRemove.push(gen.volumeName);
          cold.push(gen);
          coldCpu.push(cpuMs);
          coldLoop.push(loopP99);
        }
      }
    }
    const last = cold.at(-1)!;
    const deps = { docker, redis, prefix: `bench${process.pid}r${ROUNDS - 1}`, log };

    // First preparation of a fresh process on an installed volume: hash in a new builder thread + probe.
    forgetRuntimeCaches();
    await stopRuntimeBuilder();
    const firstWarm = await prepareRuntime(deps, inputs);
    const warm: RuntimeGeneration[] = [];
    for (let i = 0; i < WARM_CALLS; i++) warm.push(await prepareRuntime(deps, inputs));

    const loop = { worker: [] as Array<{ p99: number; max: number; buildMs: number }>, main: [] as Array<{ p99: number; max: number; buildMs: number }> };
    for (let round = 0; round < ROUNDS; round++) {
      loop.worker.push(await loopDelayDuringBuild(inputs, false));
      loop.main.push(await loopDelayDuringBuild(inputs, true));
    }

    const coldMs = cold.map((g) => g.prepareMs);
    const warmMs = warm.map((g) => g.prepareMs);
    const ratio = median(coldMs) / median(baseline);
    const mb = (last.bytesCopied / 1e6).toFixed(1);
    console.log(`runtime generations, ${inputs.length} inputs, ${mb} MB archive, ${ROUNDS} rounds, ${os.cpus().length} cores, load ${os.loadavg()[0]!.toFixed(1)}`);
    console.log(`  cold prepareRuntime (fresh process state)   median ${ms(median(coldMs))}  [${coldMs.map(ms).join(', ')}]  bytesCopied ${last.bytesCopied}`);
    console.log(`  tar -c | docker cp - (same folder)          median ${ms(median(baseline))}  [${baseline.map(ms).join(', ')}]`);
    console.log(`  ratio cold / baseline                       ${ratio.toFixed(2)}x  (goal <= 1.5x)`);
    console.log(`  CPU time: cold prepareRuntime (all threads) median ${ms(median(coldCpu))}; tar + docker cp median ${ms(median(baselineCpu))}`);
    console.log(`  warm, first check of a fresh process        ${ms(firstWarm.prepareMs)}  warm=${firstWarm.warm} bytesCopied ${firstWarm.bytesCopied}`);
    console.log(
      `  warm, volume already seen ready (${WARM_CALLS} calls)   median ${ms(median(warmMs))}  p95 ${ms(pct(warmMs, 95))}  max ${ms(Math.max(...warmMs))}` +
        `  bytesCopied total ${warm.reduce((s, g) => s + g.bytesCopied, 0)}  (goal < 5 ms, 0 bytes)`,
    );
    const row = (name: string, xs: Array<{ p99: number; max: number; buildMs: number }>) =>
      console.log(`  event-loop delay p99 during a cold build, ${name}  median ${ms(median(xs.map((x) => x.p99)))}  [${xs.map((x) => ms(x.p99)).join(', ')}]  max ${ms(Math.max(...xs.map((x) => x.max)))}  build ${ms(median(xs.map((x) => x.buildMs)))}`);
    row('builder thread', loop.worker);
    row('main thread   ', loop.main);
    console.log(`  event-loop delay p99 during the cold prepareRuntime runs above  median ${ms(median(coldLoop))}  [${coldLoop.map(ms).join(', ')}]`);
    console.log('  (goal: builder thread p99 < 20 ms)');
  } finally {
    await stopRuntimeBuilder();
    for (const name of toRemove) await docker.getVolume(name).remove().catch(() => undefined);
    await rm(folder, { recursive: true, force: true });
    await redis.quit();
    await redisServer.stop();
  }
}

await main();
