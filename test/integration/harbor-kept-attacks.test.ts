// Hostile Harbor tasks whose non-root agent (the oracle, as builder) leaves processes running through
// grading (agentProcesses: keep, the default) that try to get a reward the test never writes: by racing
// the recreation of /logs/verifier, by links laid out in /logs for a root that follows them, by tripping
// the grader's copy of the workspace and /logs on its stdout, and by starving the grader of memory or
// pids. None of them may end with a reward: a reward_file_missing error, or for the resource attacks
// any error with a kind.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, enqueueFile, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor-kept-attacks');
const FILE_ATTACKS = ['race-verifier', 'symlink-layout', 'evidence-inject'];
const RESOURCE_ATTACKS = ['oom-grader', 'pid-squeeze'];

describe('Harbor: processes a non-root agent left running cannot reward it', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'harbor-kept-w', { concurrency: 3 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  async function run(tasks: string[], agent: string): Promise<Map<string, EpisodeResult>> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-harbor-kept-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `tasks: ${JSON.stringify(tasks)}\nagent: ${agent}\nsamples: 1\n`);
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 780_000);
    await waitForNoContainers(plan.batchId, 60_000);
    return new Map(results.map((r) => [r.taskId, r]));
  }

  async function verifierLog(r: EpisodeResult): Promise<string> {
    return readFile(path.join(env.dataDir, 'evidence', r.episodeId, `attempt-${r.attempts ?? 1}`, 'logs', 'verifier', 'test-stdout.txt'), 'utf8').catch((e: Error) => `(no log: ${e.message})`);
  }

  it('no kept attacker gets a reward', async () => {
    const byTask = await run([...FILE_ATTACKS, ...RESOURCE_ATTACKS].map((id) => path.join(FIXTURES, id)), '{ kind: oracle }');
    for (const id of FILE_ATTACKS) {
      const r = byTask.get(id)!;
      const why = `${JSON.stringify({ status: r.status, reward: r.reward, error: r.error, grading: r.grading, attempts: r.attempts })}\n${(await verifierLog(r)).slice(0, 2000)}`;
      expect({ id, status: r.status, reward: r.reward, code: r.error?.code }, why).toEqual({ id, status: 'error', reward: null, code: 'reward_file_missing' });
      // Whatever the attack did to the files, the evidence is kept: evidence.json, with /logs's own record.
      const kept = JSON.parse(await readFile(path.join(env.dataDir, 'evidence', r.episodeId, `attempt-${r.attempts}`, 'evidence.json'), 'utf8')) as { logs?: unknown; besideGrader?: unknown };
      expect(kept.besideGrader, `${id}: evidence.json names what ran beside the grader`).toBeDefined();
    }
    for (const id of RESOURCE_ATTACKS) {
      const r = byTask.get(id)!;
      expect(r.reward, id).not.toBe(1);
      expect(r.status, id).toBe('error');
      expect(r.reward, id).toBeNull();
      expect(r.error?.kind, id).toBeTruthy();
    }
  }, 900_000);
});
