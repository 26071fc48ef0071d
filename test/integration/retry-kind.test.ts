// `rollout-fleet retry <batch> --kind infra` re-enqueues only the episodes that ended with that kind;
// every other result stays as it was.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { taskArchiveKey } from '../../src/redis/redis-keys.ts';
import { runCli, spawnWorker, startFleetEnv, waitFor, waitForNoContainers, type FleetEnv, type WorkerProcess, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const task = (id: string) => ({
  yaml: `id: ${id}\ninstruction: x\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\n`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
});

describe('retry by kind', () => {
  let env: FleetEnv;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    await env?.close();
  });

  it('requeues the infra failures and keeps the rest', async () => {
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "echo fixed > state.txt" }\n', { good: task('good'), lost: task('lost') });
    const plan = await enqueueFile(env, file);
    const lost = plan.jobs.find((j) => j.task.id === 'lost')!;
    // `lost` loses its task archive: invalid input. `good` meets an engine that answers nothing in
    // time (a 1 ms deadline on every Docker call) with no infra retries left: kind infra.
    await env.client.del(taskArchiveKey(env.prefix, lost.taskDigest));
    const broken = spawnWorker({ ...env.env, FLEET_DOCKER_CALL_TIMEOUT_MS: '1', FLEET_INFRA_RETRIES: '0' }, 'broken-engine');
    workers.push(broken);
    const first = await waitFor('both results', async () => {
      const r = await env.results.results(plan.batchId);
      return r.length === 2 ? r : undefined;
    }, 60_000, 200);
    expect(Object.fromEntries(first.map((r) => [r.taskId, r.error?.kind]))).toEqual({ good: 'infra', lost: 'invalid' });
    const lostBefore = first.find((r) => r.taskId === 'lost');
    expect(await broken.stop()).toBe(0);

    workers.push(spawnWorker(env.env, 'healthy'));
    const run = await runCli(['retry', plan.batchId, '--kind', 'infra'], env.env);
    expect(run.code).toBe(0);
    expect(run.stdout).toContain(`${plan.batchId}.good.0: requeued`);
    expect(run.stdout).toContain('1 episode(s) of kind infra requeued');

    const after = await waitFor('good to pass', async () => {
      const r = await env.results.results(plan.batchId);
      return r.find((x) => x.taskId === 'good')?.status === 'passed' ? r : undefined;
    }, 60_000, 200);
    expect(after.find((r) => r.taskId === 'good')).toMatchObject({ status: 'passed', reward: 1, workerId: 'healthy', attempts: 2 });
    expect(after.find((r) => r.taskId === 'lost')).toEqual(lostBefore);
    await waitForNoContainers(plan.batchId);
  });
});
