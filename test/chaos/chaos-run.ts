// A chaos run: a batch whose every reward is known in advance (half the episodes must pass, half must
// fail) runs on real worker processes while faults strike at random moments: kill -9 of a worker,
// SIGTERM of one or of all, Redis killed and restarted from its AOF, dockerd restarted (on a private
// second engine). Then the run is judged by what users care about: results lost, results recorded
// twice, rewards that differ from the known ones (an infrastructure failure scored as a reward), and
// sandboxes left behind after the reaper has had its turn. `npm run chaos` prints the figures;
// test/integration/chaos.test.ts runs a short version in the suite.
import { spawn as spawnChild, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { connect } from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { freePort, startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import { BIN, docker as sharedDocker, enqueueFile, fleetContainers, fleetEnvOn, spawnWorker, waitFor, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';
import { createSecondEngine, type SecondEngine } from '../helpers/second-engine.ts';

export const FAULT_KINDS = ['kill-worker', 'term-worker', 'term-all', 'restart-redis', 'restart-dockerd', 'model-down', 'model-hang'] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];

export interface ChaosOptions {
  /** Episodes in the batch (rounded up to even: half pass, half fail). */
  episodes: number;
  workers: number;
  /** Episodes per worker at once. */
  concurrency: number;
  /** How many faults strike, in all. */
  faults: number;
  /** Which faults, drawn at random for each strike. `restart-dockerd` needs `secondEngine`. */
  kinds: readonly FaultKind[];
  /** Between two faults: a random pause in [min, max] ms, counted from when an episode is running. */
  gapMs: [number, number];
  /** Run the sandboxes on a private second engine (required to restart dockerd). */
  secondEngine: boolean;
  /** The seed of the fault schedule (which fault, which worker, when). */
  seed: number;
  /** Give up waiting for the results after this long. */
  timeoutMs: number;
  /** Each agent works a random 0 to this many seconds before it answers (longer: more faults mid-agent). @default 3 */
  agentMaxSec?: number;
  /**
   * `command`: a shell agent. `llm`: the reference agent against the scripted policy server, run as
   * its own process so the `model-down` (killed, restarted) and `model-hang` (answers nothing for a
   * while) faults can strike it. @default command
   */
  agent?: 'command' | 'llm';
  log?: (line: string) => void;
}

export interface ChaosFigures {
  episodes: number;
  faults: Record<FaultKind, number>;
  /** Episodes that ended with a result (any status). */
  recorded: number;
  /** Episodes without a result when the run gave up. */
  lost: number;
  /** Results refused because the episode had one already (a second run got as far as recording). */
  doubled: number;
  /** Graded results whose reward differs from the one the task guarantees. */
  misgraded: number;
  /** Episodes that ended as error, kind infra (retries exhausted): not lost, not graded. */
  infraErrors: number;
  /** Episodes that ended as error, kind model (the endpoint failed past every retry): not graded. */
  modelErrors: number;
  /** Sandboxes of the run still on the engine after the reaper's interval (three times over). */
  sandboxesLeft: number;
  wallMs: number;
}

/** A small deterministic generator (mulberry32), so a schedule can be replayed from its seed. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const REAPER_INTERVAL_MS = 2_000;

/** Two tasks whose rewards are known: `pass` always passes, `fail` always fails (1 and 0). */
async function chaosBatch(samples: number, agentMaxSec: number, agent: 'command' | 'llm'): Promise<string> {
  const task = (id: string, answer: string) => ({
    yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\n` +
      'deadlineSec: 120\nreserves: { setupSec: 30, verifySec: 20, closeSec: 15 }\n',
    // The scripted model plays solution/solve.sh; the shell agent reads the answer file.
    files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '', 'workspace/answer': `${answer}\n`, 'solution/solve.sh': `#!/bin/sh\necho ${answer} > state.txt\n` },
  });
  // The shell agent works for a moment (so faults find episodes mid-agent), then writes its answer.
  const agentSpec = agent === 'llm'
    ? '{ kind: llm, maxTurns: 12 }'
    : `{ kind: command, command: "sleep $((RANDOM % ${agentMaxSec})); cat answer > state.txt" }`;
  return writeBatch(`name: chaos\ntasks: [tasks]\nsamples: ${samples}\nagent: ${agentSpec}\n`, {
    pass: task('pass', 'fixed'),
    fail: task('fail', 'wrong'),
  });
}

/** The scripted policy server as its own process, on a fixed loopback port so it can come back there. */
function modelStub(port: number, tasksDir: string, delayMs = 0): ChildProcess {
  return spawnChild(process.execPath, [BIN, 'model-stub', '--port', String(port), '--tasks', tasksDir, ...(delayMs > 0 ? ['--delay-ms', String(delayMs)] : [])], { stdio: 'ignore' });
}

const accepts = (port: number) => new Promise<boolean>((resolve) => {
  const socket = connect({ port, host: '127.0.0.1' }, () => {
    socket.destroy();
    resolve(true);
  });
  socket.once('error', () => resolve(false));
});

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = once(child, 'exit');
  child.kill('SIGKILL');
  await exited;
}

export async function runChaos(opts: ChaosOptions): Promise<ChaosFigures> {
  if (opts.kinds.includes('restart-dockerd') && !opts.secondEngine) throw new TypeError('restart-dockerd needs secondEngine: true');
  const log = opts.log ?? (() => undefined);
  const rand = random(opts.seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(rand() * items.length)]!;
  const started = performance.now();
  const redisDir = await mkdtemp(path.join(os.tmpdir(), 'rf-chaos-redis-'));
  let redis: PrivateRedis = await startPrivateRedis({ durable: true, dir: redisDir });
  const env: FleetEnv = await fleetEnvOn(redis);
  const engine: SecondEngine | undefined = opts.secondEngine ? await createSecondEngine() : undefined;
  const docker = engine?.docker ?? sharedDocker;
  const agent = opts.agent ?? 'command';
  if (agent === 'command' && opts.kinds.some((k) => k.startsWith('model-'))) throw new TypeError('model faults need agent: llm');
  const batchFile = await chaosBatch(Math.ceil(opts.episodes / 2), opts.agentMaxSec ?? 3, agent);
  const tasksDir = path.join(path.dirname(batchFile), 'tasks');
  const stubPort = agent === 'llm' ? await freePort() : 0;
  let stub: ChildProcess | undefined;
  const startStub = async (delayMs = 0) => {
    stub = modelStub(stubPort, tasksDir, delayMs);
    await waitFor('the model stub to listen', () => accepts(stubPort), 30_000, 50);
  };
  if (agent === 'llm') await startStub();
  const workerEnv = {
    ...env.env,
    ...(engine && { DOCKER_HOST: engine.host }),
    // Short leases, locks and reaper interval: a killed worker's episodes and sandboxes are found fast.
    FLEET_LEASE_TTL_MS: '3000',
    FLEET_LOCK_DURATION_MS: '5000',
    FLEET_REAPER_INTERVAL_MS: String(REAPER_INTERVAL_MS),
    FLEET_DRAIN_TIMEOUT_MS: '3000',
    FLEET_INFRA_RETRIES: '10',
    ...(agent === 'llm' && {
      MODEL_BASE_URL: `http://127.0.0.1:${stubPort}/v1`,
      // A hung model is an error after 3 s and one retry; the episode is then retried (kind model).
      MODEL_REQUEST_TIMEOUT_MS: '3000',
      MODEL_UPSTREAM_RETRIES: '1',
      FLEET_MODEL_RETRIES: '10',
    }),
  };
  let serial = 0;
  const spawn = () => spawnWorker(workerEnv, `chaos-w${++serial}`, opts.concurrency);
  let workers: WorkerProcess[] = Array.from({ length: opts.workers }, spawn);
  const outputs: string[] = [];
  const retire = (w: WorkerProcess) => outputs.push(w.output());
  const faults = Object.fromEntries(FAULT_KINDS.map((k) => [k, 0])) as Record<FaultKind, number>;
  const episodes = Math.ceil(opts.episodes / 2) * 2;

  const killWorker = async (w: WorkerProcess, signal: NodeJS.Signals) => {
    if (w.child.exitCode === null && w.child.signalCode === null) {
      const exited = once(w.child, 'exit');
      w.child.kill(signal);
      await exited;
    }
    retire(w);
  };

  try {
    const plan = await enqueueFile(env, batchFile);
    const allRecorded = async () => (await env.results.resultCount(plan.batchId)) >= episodes;
    for (let n = 0; n < opts.faults && !(await allRecorded()); n++) {
      // Strike while episodes run: wait for one, then a random moment later.
      await waitFor('an episode to be running', async () => (await env.episodes.getActiveCount().catch(() => 0)) > 0 || (await allRecorded()), 120_000, 100);
      const gap = opts.gapMs[0] + rand() * (opts.gapMs[1] - opts.gapMs[0]);
      await new Promise((r) => setTimeout(r, gap));
      const kind = pick(opts.kinds);
      faults[kind] += 1;
      log(`fault ${n + 1}/${opts.faults}: ${kind} at ${Math.round(performance.now() - started)} ms`);
      switch (kind) {
        case 'kill-worker':
        case 'term-worker': {
          const victim = pick(workers);
          await killWorker(victim, kind === 'kill-worker' ? 'SIGKILL' : 'SIGTERM');
          workers = [...workers.filter((w) => w !== victim), spawn()];
          break;
        }
        case 'term-all':
          await Promise.all(workers.map((w) => killWorker(w, 'SIGTERM')));
          workers = Array.from({ length: opts.workers }, spawn);
          break;
        case 'restart-redis': {
          const exited = once(redis.process, 'exit');
          redis.process.kill('SIGKILL');
          await exited;
          redis = await startPrivateRedis({ durable: true, dir: redisDir, port: redis.port });
          env.redis = redis;
          break;
        }
        case 'restart-dockerd':
          await engine!.stop();
          await engine!.start();
          break;
        case 'model-down':
        case 'model-hang': {
          // Down: connections refused for a while. Hang: connections taken, nothing answered for a while.
          await stopChild(stub!);
          if (kind === 'model-hang') await startStub(600_000);
          await new Promise((r) => setTimeout(r, 1_000 + rand() * 4_000));
          if (kind === 'model-hang') await stopChild(stub!);
          await startStub();
          break;
        }
      }
    }

    log('faults over; waiting for every result');
    await waitFor('every episode to end', allRecorded, opts.timeoutMs, 500).catch(() => undefined);
    const results: EpisodeResult[] = await env.results.results(plan.batchId);
    const expected = (r: EpisodeResult) => (r.taskId === 'pass' ? 1 : 0);
    const misgraded = results.filter((r) => r.reward !== null && r.reward !== expected(r));
    for (const r of misgraded) log(`misgraded: ${r.episodeId} ${r.status} reward ${r.reward}`);
    // Nothing of the run may stay on the engine once the reaper has had its turns.
    const left = await waitFor('no sandbox of the run', async () => (await fleetContainers('fleet', env.prefix, docker)).length === 0, REAPER_INTERVAL_MS * 3 + 30_000, 500)
      .then(() => 0, async () => (await fleetContainers('fleet', env.prefix, docker)).length);
    const all = [...outputs, ...workers.map((w) => w.output())].join('\n');
    return {
      episodes,
      faults,
      recorded: new Set(results.map((r) => r.episodeId)).size,
      lost: episodes - new Set(results.map((r) => r.episodeId)).size,
      doubled: (all.match(/episode already had a result/g) ?? []).length,
      misgraded: misgraded.length,
      infraErrors: results.filter((r) => r.status === 'error' && r.error?.kind === 'infra').length,
      modelErrors: results.filter((r) => r.status === 'error' && r.error?.kind === 'model').length,
      sandboxesLeft: left,
      wallMs: Math.round(performance.now() - started),
    };
  } finally {
    // Cleaning up must not cost the figures: each step on its own, failures only logged.
    const step = (what: string, work: () => Promise<unknown>) => work().catch((err: unknown) => log(`cleanup: ${what} failed: ${String(err)}`));
    await step('stopping the workers', () => Promise.all(workers.map((w) => w.stop())));
    if (stub) await step('stopping the model stub', () => stopChild(stub!));
    await step('closing the fleet env', () => env.close());
    await step('removing the second engine', async () => engine?.destroy());
    await step('removing the Redis folder', () => rm(redisDir, { recursive: true, force: true }));
  }
}
