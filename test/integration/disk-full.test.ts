// The data folder's disk fills up under a running worker (a small loop-mounted file system, filled to
// the last block once the runtime is in place): every episode still ends with exactly one result in
// Redis, graded right or an error with a kind, and the worker stays up to run the next batch once
// space is back. Needs root (mount), as the whole suite does.
import { execFile } from 'node:child_process';
import { mkdtemp, rm, statfs, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { startPrivateRedis } from '../../src/cli/private-redis.ts';
import { enqueueFile, fleetEnvOn, startEnvWorker, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const run = promisify(execFile);

/** Two tasks with known rewards: `pass` passes, `fail` fails. */
const batch = (name: string) => writeBatch(`name: ${name}\ntasks: [tasks]\nsamples: 2\nagent: { kind: command, command: "cat answer > state.txt" }\n`, Object.fromEntries(
  [['pass', 'fixed'], ['fail', 'wrong']].map(([id, answer]) => [id!, {
    yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 60, verifySec: 20, closeSec: 15 }\n`,
    files: { 'workspace/state.txt': 'broken\n', 'workspace/answer': `${answer}\n`, 'tests/.keep': '' },
  }]),
));

describe('data folder disk full', () => {
  let env: FleetEnv;
  let worker: WorkerHandle | undefined;
  let dir: string;
  let mountPoint: string;

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'rf-diskfull-'));
    const image = path.join(dir, 'fs.img');
    mountPoint = path.join(dir, 'data');
    // Room for the runtime generation's cached inputs (the portable node, ~100 MB) and little else.
    await run('truncate', ['-s', '256M', image]);
    await run('mkfs.ext4', ['-q', '-F', image]);
    await run('mkdir', ['-p', mountPoint]);
    await run('mount', ['-o', 'loop', image, mountPoint]);
    env = await fleetEnvOn(await startPrivateRedis(), { dataDir: mountPoint });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
    if (mountPoint) await run('umount', [mountPoint]).catch(() => run('umount', ['-l', mountPoint]));
    await rm(dir, { recursive: true, force: true });
  });

  it('ends every episode once, never misgraded, and the worker runs on once space is back', async () => {
    worker = await startEnvWorker(env, 'diskfull-w', { concurrency: 2 });
    // Warm: the runtime's inputs are cached in the data folder, as on any worker.
    const warm = await enqueueFile(env, await batch('warm'));
    await waitForResults(env, warm.batchId, 4, 180_000);

    // Fill the file system to its last block.
    const filler = path.join(mountPoint, 'filler');
    const { bavail, bsize } = await statfs(mountPoint);
    await run('fallocate', ['-l', String(bavail * bsize), filler]);
    for (let i = 0; ; i++) {
      const written = await writeFile(path.join(mountPoint, `crumb-${i}`), Buffer.alloc(4096)).then(() => true, () => false);
      if (!written) break;
    }
    expect((await statfs(mountPoint)).bavail).toBe(0);

    const full = await enqueueFile(env, await batch('full'));
    const results = await waitForResults(env, full.batchId, 4, 180_000);
    expect(new Set(results.map((r) => r.episodeId)).size).toBe(4);
    for (const r of results) {
      // Graded right, or not graded at all (an error with a kind): never a wrong reward.
      if (r.reward !== null) expect(r.reward, r.episodeId).toBe(r.taskId === 'pass' ? 1 : 0);
      else expect(r.error?.kind, r.episodeId).toBeDefined();
    }
    await waitForNoContainers(full.batchId);

    // Space is back: the same worker runs the next batch, graded as usual.
    await rm(filler);
    const after = await enqueueFile(env, await batch('after'));
    const again = await waitForResults(env, after.batchId, 4, 180_000);
    expect(again.map((r) => [r.taskId, r.reward]).sort()).toEqual([['fail', 0], ['fail', 0], ['pass', 1], ['pass', 1]]);
  }, 600_000);
});
