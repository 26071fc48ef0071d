// Cancellation from another process: a waiting episode is removed and recorded cancelled; a running
// one is stopped wherever it runs, closed with its evidence and recorded cancelled; one already
// closing is not interrupted: the caller hears of the conflict and the episode ends as it would have.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { EpisodeControl } from '../../src/episode/episode-control.ts';
import { cancelEpisode, waitForResult } from '../../src/producer/cancel-episodes.ts';
import { episodePhaseKey } from '../../src/redis/redis-keys.ts';
import { runCli, waitForSandboxFile, spawnWorker, startFleetEnv, waitFor, waitForNoContainers, type FleetEnv, type WorkerProcess, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const task = (id: string) => ({
  yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\nreserves: { setupSec: 20, closeSec: 30 }\n`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
});

describe('cancel', () => {
  let env: FleetEnv;
  let worker: WorkerProcess | undefined;

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await worker?.stop();
    await env?.close();
  });

  async function enqueue(agentCommand: string, id: string) {
    const file = await writeBatch(`name: ${id}\ntasks: [tasks]\nagent: { kind: command, command: ${JSON.stringify(agentCommand)} }\n`, { [id]: task(id) });
    const plan = await enqueueFile(env, file);
    return { batchId: plan.batchId, episodeId: plan.jobs[0]!.episodeId, file };
  }

  it('removes a waiting episode and records it cancelled', async () => {
    const { batchId, episodeId, file } = await enqueue('echo fixed > state.txt', 'waiting');
    // No worker runs: a wait with a timeout gives up with exit 4 and the summary so far.
    const wait = await runCli(['enqueue', file, '--wait', '--json', '--timeout-ms', '300'], env.env);
    expect(wait.code).toBe(4);
    expect(JSON.parse(wait.stdout)).toMatchObject({ batchId, total: 1, done: 0, finished: false });
    const run = await runCli(['cancel', episodeId], env.env);
    expect(run.stdout).toBe(`${episodeId}: cancelled (it was waiting)\n`);
    expect(run.code).toBe(0);
    expect(await env.episodes.getJob(episodeId)).toBeUndefined();
    expect(await env.results.get(batchId, episodeId)).toMatchObject({ status: 'cancelled', reward: null });
  });

  it('stops a running episode in another process, keeps its evidence and records it cancelled', async () => {
    worker = spawnWorker(env.env, 'cancel-w');
    const { batchId, episodeId } = await enqueue("echo started; touch started; trap '' TERM; sleep 600", 'running');
    await waitForSandboxFile('episode', episodeId, '/workspace/started');
    const started = Date.now();
    const run = await runCli(['cancel', batchId], env.env);
    expect(run.stdout).toBe(`${episodeId}: cancelled (it was running)\n`);
    expect(run.code).toBe(0);
    expect(Date.now() - started).toBeLessThan(20_000);
    const result = await env.results.get(batchId, episodeId);
    expect(result).toMatchObject({ status: 'cancelled', reward: null, attempts: 1 });
    expect(result!.verifier).toBeUndefined();
    const stdout = await readFile(path.join(env.dataDir, 'evidence', episodeId, 'attempt-1', 'agent.stdout.txt'), 'utf8');
    expect(stdout).toBe('started\n');
    await waitForNoContainers(batchId);
  });

  it('does not interrupt an episode that is already closing, and says so', async () => {
    worker ??= spawnWorker(env.env, 'cancel-w');
    // A large workspace makes the close (snapshot and diff) last long enough to be caught in it.
    const { batchId, episodeId } = await enqueue('head -c 300000000 /dev/zero > big.bin; echo fixed > state.txt', 'closing');
    const control = new EpisodeControl(env.client, env.prefix);
    await waitFor('the episode to be closing', async () => (await env.client.get(episodePhaseKey(env.prefix, episodeId))) === 'closing', 60_000, 5);
    const outcome = await cancelEpisode({ queue: env.episodes, results: env.results, control, by: 'test' }, episodeId);
    expect(outcome).toBe('closing');
    const result = await waitForResult(env.results, batchId, episodeId, 60_000);
    expect(result).toMatchObject({ status: 'passed', reward: 1 });
    const diff = await readFile(path.join(env.dataDir, 'evidence', episodeId, 'attempt-1', 'workspace.diff'), 'utf8');
    expect(diff).toContain('+fixed');
    await waitForNoContainers(batchId);
  });
});
