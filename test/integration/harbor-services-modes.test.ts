// Task services with the other Harbor modes (test/fixtures/harbor-services, written for this suite):
// a separate verifier whose collect hook runs in a sidecar and which gets an artifact copied out of
// that sidecar, while the sidecar itself stays out of its reach; and a multi-step task whose sidecar
// lives through both steps. Nothing of either environment is left after the batch.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, docker, runTaskFolders, startEnvWorker, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor-services');
const TASKS = ['separate-sidecar', 'steps-sidecar'].map((t) => path.join(FIXTURES, t));

describe('Harbor task services with a separate verifier or several steps', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'services-modes-w', { concurrency: 2 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  async function run(agent: string): Promise<Map<string, EpisodeResult>> {
    const byTask = await runTaskFolders(env, TASKS, agent);
    // No task volume is left either (runTaskFolders waited for the containers).
    const batchId = [...byTask.values()][0]!.batchId;
    const { Volumes } = await docker.listVolumes({ filters: { label: [`${LABEL.batch}=${batchId}`] } });
    expect((Volumes ?? []).map((v) => v.Name)).toEqual([]);
    return byTask;
  }

  it('the oracle passes both: the hook ran in the sidecar (with bash), its copy reached the verifier, the sidecar did not; the sidecar kept step one\'s value for step two', async () => {
    const byTask = await run('{ kind: oracle }');
    const separate = byTask.get('separate-sidecar')!;
    expect(separate, JSON.stringify(separate.error)).toMatchObject({ status: 'passed', reward: 1, metrics: { reward: 1, ledger_reachable: 0, hook_ran: 1 } });
    const stdout = await readFile(path.join(env.dataDir, 'evidence', separate.episodeId, 'attempt-1', 'logs', 'verifier', 'test-stdout.txt'), 'utf8');
    expect(stdout).toMatch(/^answer=(ledger-\d+) recorded=\1 shell=bash reachable=0$/m);
    expect(byTask.get('steps-sidecar'), JSON.stringify(byTask.get('steps-sidecar')!.error)).toMatchObject({
      status: 'passed', reward: 1, metrics: { reward: 1, 'steps.one': 1, 'steps.two': 1 },
    });
  });

  it('an agent that does nothing fails both, and the sidecar\'s hook still runs', async () => {
    const byTask = await run('{ kind: command, command: "true" }');
    expect(byTask.get('separate-sidecar')).toMatchObject({ status: 'failed', reward: 0, metrics: { reward: 0, ledger_reachable: 0, hook_ran: 1 } });
    expect(byTask.get('steps-sidecar')).toMatchObject({ status: 'failed', reward: 0, metrics: { 'steps.one': 0, 'steps.two': 0 } });
  });
});
