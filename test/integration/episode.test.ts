// Episodes end to end through an in-process worker: the agent never sees the hidden tests, an agent
// past its ceiling is stopped and still graded, a broken or hanging verifier is the verifier's failure.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv, startEnvWorker, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

// A task whose verifier passes when the workspace file says "fixed".
const task = (id: string, extra = '', verify = 'grep -qx fixed state.txt') => ({
  // Set-up has room for a cold runtime install on a loaded machine; the agent gets 2 s.
  yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: ${verify}\n  timeoutSec: 3\ndeadlineSec: 41\nreserves: { setupSec: 30, verifySec: 5, closeSec: 4 }\n${extra}`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/secret.txt': 'the hidden answer\n' } as Record<string, string>,
});

describe('episodes', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'episode-w', { concurrency: 4 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  async function runBatch(agentCommand: string, tasks: Record<string, ReturnType<typeof task>>) {
    const file = await writeBatch(`tasks: [tasks]\nagent: { kind: command, command: ${JSON.stringify(agentCommand)} }\n`, tasks);
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length);
    await waitForNoContainers(plan.batchId);
    return results;
  }

  it('keeps the hidden tests out of the agent\'s reach until verification', async () => {
    const [r] = await runBatch('ls /tests; cat /tests/secret.txt; echo fixed > state.txt', { peek: task('peek', '', 'test -f /tests/secret.txt && grep -qx fixed state.txt') });
    expect(r).toMatchObject({ status: 'passed', reward: 1 });
    const evidence = path.join(env.dataDir, 'evidence', r!.episodeId, 'attempt-1');
    const stderr = await readFile(path.join(evidence, 'agent.stderr.txt'), 'utf8');
    const stdout = await readFile(path.join(evidence, 'agent.stdout.txt'), 'utf8');
    expect(stderr).toContain('/tests');
    expect(stderr).toContain('No such file or directory');
    expect(stdout).not.toContain('the hidden answer');
  });

  it('leaves nothing the agent started running to tamper with the tests once they arrive', async () => {
    const daemon = "setsid sh -c 'while true; do [ -f /tests/check.sh ] && echo \"exit 0\" > /tests/check.sh; sleep 1; done' </dev/null >/dev/null 2>&1 &";
    const [r] = await runBatch(daemon, {
      // The verifier gives a surviving daemon (it strikes every second) 2 s before it reads the tests.
      tamper: { ...task('tamper', '', 'sleep 2; sh /tests/check.sh'), files: { 'workspace/state.txt': 'broken\n', 'tests/check.sh': 'exit 1\n' } },
    });
    expect(r).toMatchObject({ status: 'failed', reward: 0 });
  });

  it('stops an agent at its ceiling (deadline minus reserves) and still grades it', async () => {
    const started = Date.now();
    const [r] = await runBatch("echo fixed > state.txt; trap '' TERM; sleep 1000", { slow: task('slow') });
    expect(r).toMatchObject({ status: 'timeout', reward: 1, agent: { timedOut: true } });
    // The ceiling is 41 - 30 - 5 - 4 = 2 s; TERM is ignored, KILL follows after the grace period.
    expect(r!.timings.agentMs).toBeGreaterThanOrEqual(2_000);
    expect(r!.timings.agentMs).toBeLessThan(8_000);
    expect(Date.now() - started).toBeLessThan(41_000 + 5_000);
  });

  it('records a hanging verifier and a crashing verifier as verifier failures, not retried', async () => {
    const results = await runBatch('echo fixed > state.txt', {
      hang: task('hang', '', 'sleep 1000'),
      // Past its 3 s timeout it ignores TERM: its stop runs into the end of the 5 s reserve. Still the
      // verifier's failure, not the fleet's.
      'hang-term': task('hang-term', '', "trap '' TERM; sleep 1000"),
      crash: task('crash', '', 'exit 3'),
    });
    const byTask = Object.fromEntries(results.map((r) => [r.taskId, r]));
    expect(byTask.hang).toMatchObject({ status: 'error', reward: null, attempts: 1, error: { kind: 'verifier', code: 'verifier_timeout' } });
    expect(byTask['hang-term']).toMatchObject({ status: 'error', reward: null, attempts: 1, error: { kind: 'verifier', code: 'verifier_timeout' } });
    expect(byTask.crash).toMatchObject({ status: 'error', reward: null, attempts: 1, error: { kind: 'verifier', code: 'verifier_crashed' } });
    expect(byTask.crash!.error!.message).toContain('exited with 3');
  });
});
