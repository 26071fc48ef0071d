// The TypeScript client a trainer uses: enqueue a batch object of two tasks x 4 samples, iterate its
// results as they finish while Redis is killed (-9) and restarted from its AOF mid-batch: every
// episode is delivered exactly once, in the stream's completion order, each task's group event comes
// right after its last sample; an iteration resumed from a cursor delivers exactly what came after it.
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { FleetClient, type BatchEvent } from '../../src/client/fleet-client.ts';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import { fleetEnvOn, spawnWorker, waitFor, waitForNoContainers, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';

async function taskFolder(root: string, id: string): Promise<string> {
  const dir = path.join(root, id);
  await mkdir(path.join(dir, 'workspace'), { recursive: true });
  await mkdir(path.join(dir, 'tests'), { recursive: true });
  await writeFile(path.join(dir, 'workspace', 'state.txt'), 'broken\n');
  await writeFile(path.join(dir, 'tests', 'test.sh'), 'grep -qx fixed state.txt\n');
  await writeFile(path.join(dir, 'task.yaml'), `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: sh /tests/test.sh\n  timeoutSec: 20\ndeadlineSec: 120\nreserves: { setupSec: 30, verifySec: 20, closeSec: 20 }\n`);
  return dir;
}

describe('TypeScript client', () => {
  let redis: PrivateRedis;
  let env: FleetEnv;
  let client: FleetClient | undefined;
  const workers: WorkerProcess[] = [];

  afterAll(async () => {
    await client?.close();
    await Promise.all(workers.map((w) => w.stop()));
    await env?.close();
  });

  it('iterates a batch\'s results and group events exactly once across a Redis restart, and resumes from a cursor', async () => {
    const redisDir = await mkdtemp(path.join(os.tmpdir(), 'rf-client-aof-'));
    redis = await startPrivateRedis({ durable: true, dir: redisDir });
    env = await fleetEnvOn(redis);
    workers.push(spawnWorker(env.env, 'client-w1', 3), spawnWorker(env.env, 'client-w2', 3));
    client = await FleetClient.connect({ redisUrl: redis.url, prefix: env.prefix });

    const root = await mkdtemp(path.join(os.tmpdir(), 'rf-client-tasks-'));
    const tasks = [await taskFolder(root, 'alpha'), await taskFolder(root, 'beta')];
    // beta's agent fails its task: its group's rewards are all 0.
    const plan = await client.enqueue({ name: 'client-groups', tasks, samples: 4, agent: { kind: 'command', command: 'sleep 1; case "$TASK_ID" in alpha) echo fixed > state.txt;; esac' } });
    expect(plan.jobs).toHaveLength(8);

    const events: BatchEvent[] = [];
    let restarted = false;
    for await (const event of client.results(plan.batchId, { blockMs: 500 })) {
      events.push(event);
      if (!restarted && events.length === 2) {
        // Mid-batch: Redis dies and comes back from its AOF; the iterator waits and reads on.
        restarted = true;
        const exited = new Promise((resolve) => redis.process.once('exit', resolve));
        redis.process.kill('SIGKILL');
        await exited;
        redis = await startPrivateRedis({ durable: true, dir: redisDir, port: redis.port });
        env.redis = redis;
      }
    }
    const results = events.filter((e) => e.kind === 'result');
    const groups = events.filter((e) => e.kind === 'group');
    expect(results.map((e) => e.result.episodeId).sort()).toEqual(plan.jobs.map((j) => j.episodeId).sort());
    // Cursors only move forward: completion order, nothing twice.
    const cursors = results.map((e) => e.cursor);
    expect(new Set(cursors).size).toBe(cursors.length);
    expect([...cursors].sort((a, b) => (a.split('-').map(Number)[0]! - b.split('-').map(Number)[0]!) || (Number(a.split('-')[1]) - Number(b.split('-')[1])))).toEqual(cursors);
    // One group event per task, right after its last sample, with every sample's reward.
    expect(groups.map((g) => g.taskId).sort()).toEqual(['alpha', 'beta']);
    for (const g of groups) {
      const i = events.indexOf(g);
      const last = events.slice(0, i).filter((e) => e.kind === 'result' && e.result.taskId === g.taskId);
      expect(last).toHaveLength(4);
      expect(events[i - 1]).toMatchObject({ kind: 'result', result: { taskId: g.taskId } });
      expect(g.rewards).toEqual(g.taskId === 'alpha' ? [1, 1, 1, 1] : [0, 0, 0, 0]);
    }

    // Resumed from the cursor of the third result: exactly the results after it, and the groups that end after it.
    const third = results[2]!;
    const resumed: BatchEvent[] = [];
    for await (const event of client.results(plan.batchId, { after: third.cursor })) resumed.push(event);
    expect(resumed.filter((e) => e.kind === 'result').map((e) => e.cursor)).toEqual(cursors.slice(3));
    expect(resumed.filter((e) => e.kind === 'group').map((e) => e.taskId).sort()).toEqual(groups.filter((g) => events.indexOf(g) > events.indexOf(third)).map((g) => g.taskId).sort());
    expect((await client.status(plan.batchId))?.done).toBe(8);
    await waitForNoContainers(plan.batchId);
    await waitFor('workers still up', async () => workers.every((w) => w.child.exitCode === null));
  });
});
