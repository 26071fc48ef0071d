// Terminal-Bench 1 task folders (test/fixtures/terminal-bench-1, written for this suite) run unchanged:
// mapped to Harbor folders, their Dockerfiles built on the stand-in base images, graded by the pytest
// summary of their run-tests.sh as Terminal-Bench grades them. A task whose tests print no summary
// cannot be graded: an error with a kind, never a reward. A server beside the client runs as a task
// service (the client is Harbor's main).
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, runTaskFolders, startEnvWorker, startFleetEnv, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/terminal-bench-1');

describe('Terminal-Bench 1 tasks', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'tb1-w', { concurrency: 3 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  const run = (tasks: string[], agent: string) => runTaskFolders(env, tasks, agent);

  it('the oracle solves them (solution.sh, and solution.yaml typed into bash); no pytest summary is an error', async () => {
    const byTask = await run([FIXTURES], '{ kind: oracle }');
    expect(byTask.get('count-words')).toMatchObject({ status: 'passed', reward: 1, metrics: { tests_passed: 3, tests_total: 3 }, provenance: { environment: { source: 'built' } } });
    expect(byTask.get('keystrokes')).toMatchObject({ status: 'passed', reward: 1, metrics: { tests_passed: 1, tests_total: 1 } });
    expect(byTask.get('no-summary')).toMatchObject({ status: 'error', reward: null, error: { kind: 'verifier', code: 'reward_file_missing' } });
    // A server beside the client, built from its own folder, waited for healthy and up through grading.
    expect(byTask.get('with-server'), JSON.stringify(byTask.get('with-server')?.error)).toMatchObject({ status: 'passed', reward: 1, metrics: { tests_passed: 2, tests_total: 2 } });
    // run-tests.sh's output is kept with the verifier's evidence, as the pane is in Terminal-Bench.
    const r = byTask.get('count-words')!;
    const out = await readFile(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1', 'logs', 'verifier', 'run-tests.txt'), 'utf8');
    expect(out).toMatch(/short test summary info/);
    expect(out).toMatch(/PASSED .*test_count/);
  });

  it('an agent that does nothing fails, with the tests that passed anyway counted', async () => {
    const byTask = await run(['count-words', 'keystrokes', 'with-server'].map((t) => path.join(FIXTURES, t)), '{ kind: command, command: "true" }');
    // test_environment_from_compose passes without the agent: the compose file's environment is in the image.
    expect(byTask.get('count-words')).toMatchObject({ status: 'failed', reward: 0, metrics: { tests_passed: 1, tests_total: 3 } });
    expect(byTask.get('keystrokes')).toMatchObject({ status: 'failed', reward: 0, metrics: { tests_passed: 0, tests_total: 1 } });
    expect(byTask.get('with-server')).toMatchObject({ status: 'failed', reward: 0, metrics: { tests_passed: 1, tests_total: 2 } });
  });
});
