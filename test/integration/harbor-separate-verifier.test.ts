// Harbor's separate verifier (test/fixtures/harbor-separate, written for this suite): the grader runs
// in a container of its own, built from tests/ or the agent's image afresh, and sees only the declared
// artifacts and /logs/artifacts. A root agent that poisoned the interpreter of its own container
// changes nothing of the grade. Nothing of either container is left after the batch.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, runTaskFolders, startEnvWorker, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor-separate');

describe('Harbor tasks with a separate verifier', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'separate-w', { concurrency: 3 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  const run = (agent: string) => runTaskFolders(env, [FIXTURES], agent);

  it('the oracle passes; the verifier sees the artifacts and nothing else; a poisoned interpreter grades nothing', async () => {
    const byTask = await run('{ kind: oracle }');
    expect(byTask.get('own-image')).toMatchObject({ status: 'passed', reward: 1, metrics: { reward: 1, isolated: 1 } });
    expect(byTask.get('fresh-copy')).toMatchObject({ status: 'passed', reward: 1, metrics: { reward: 1, fresh: 1 } });
    // Its "solution" replaced python3 with a reward planter in the agent's container, which is stopped
    // before the verifier starts in its own.
    expect(byTask.get('poisoned-interpreter')).toMatchObject({ status: 'failed', reward: 0 });
    // The verifier's logs are kept with the episode's evidence.
    const r = byTask.get('own-image')!;
    const reward = await readFile(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1', 'logs', 'verifier', 'reward.json'), 'utf8');
    expect(JSON.parse(reward)).toEqual({ reward: 1, isolated: 1 });
  });

  it('an agent that does nothing fails', async () => {
    const byTask = await run('{ kind: command, command: "true" }');
    for (const id of ['own-image', 'fresh-copy', 'poisoned-interpreter']) expect(byTask.get(id), id).toMatchObject({ status: 'failed', reward: 0 });
  });
});
