// The warm sandbox pool (src/sandbox/sandbox-pool.ts) on the real engine: episodes claim warm sandboxes
// (hardened as any, used once, never returned), an llm episode's proxy socket lives in the claimed
// sandbox's own folder, the claim is in Redis for the reaper; kill -9 of a worker with a full pool
// leaves nothing once the reaper ran; a drain removes the pool; a runtime generation change drops
// the sandboxes that mount the old one; a Harbor task's episodes claim warm sandboxes of its built
// image, made as its own would be (ENTRYPOINT and USER kept, the keep-alive its argument, /logs made);
// while more samples of a task wait, warm sandboxes are seeded with its workspace.
import { readFile, readdir } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { SEED_COMMAND_MIN_BYTES } from '../../src/episode/set-up-phase.ts';
import { sandboxClaimKey } from '../../src/redis/redis-keys.ts';
import { SandboxPool } from '../../src/sandbox/sandbox-pool.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { ROOT, docker, enqueueFile, fleetContainers, sandboxHasFile, silentLog, spawnWorker, startEnvWorker, startFleetEnv, waitFor, waitForResults, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { startModelStub } from '../../src/model/model-stub.ts';
import { EXAMPLE_TASKS } from '../helpers/model.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

/** The permission bits of the first entry of a tar stream (the folder itself, for a folder). */
async function tarModeOf(stream: NodeJS.ReadableStream): Promise<number> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(chunk as Buffer);
  const header = Buffer.concat(chunks).subarray(0, 512);
  return parseInt(header.subarray(100, 108).toString('ascii').replace(/\0.*$/, '').trim(), 8) & 0o777;
}

const task = (id: string) => ({
  yaml: `id: ${id}\ninstruction: write fixed into state.txt\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 30, closeSec: 20 }\n`,
  files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
});

const pooled = (workerId: string) => fleetContainers('pool', workerId);

describe('warm sandbox pool', () => {
  let env: FleetEnv;
  const processes: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
  });
  afterAll(async () => {
    await Promise.all(processes.map((w) => w.stop()));
    await env?.close();
  });

  it('runs episodes in claimed warm sandboxes, each used once, hardened, claimed in Redis; a drain removes the pool', async () => {
    const worker: WorkerHandle = await startEnvWorker(env, 'pool-w', { concurrency: 1, sandboxPool: 1 });
    try {
      const file = await writeBatch('tasks: [tasks]\nsamples: 4\nagent: { kind: command, command: "echo fixed > state.txt; id -u > uid.txt" }\n', { one: task('one') });
      const plan = await enqueueFile(env, file);
      const results = await waitForResults(env, plan.batchId, 4);
      for (const r of results) expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1 });
      // A command agent with a small workspace: never seeded (its own exec unpacks the workspace), though more of its task waited.
      expect(results.filter((r) => r.sandbox?.seeded).map((r) => r.sandbox), JSON.stringify(results.map((r) => r.sandbox))).toEqual([]);
      // The first episode found the pool empty and made its own; one at a time, the next ones found it filled.
      const claimed = results.filter((r) => r.sandbox?.pooled);
      expect(claimed.length, JSON.stringify(results.map((r) => r.sandbox))).toBeGreaterThanOrEqual(2);
      expect(new Set(results.map((r) => r.sandbox!.containerId)).size).toBe(4);
      // Each claim was recorded for the reaper, and is gone with its sandbox (the cleanup queue).
      await waitFor('claimed sandboxes removed with their claims', async () => {
        for (const r of claimed) {
          if (await env.client.exists(sandboxClaimKey(env.prefix, r.sandbox!.containerId))) return false;
          if ((await docker.listContainers({ all: true, filters: { id: [r.sandbox!.containerId] } })).length > 0) return false;
        }
        return true;
      }, 30_000, 200);
      // The agent ran as the sandbox user in a warm sandbox too; the workspace snapshot says so.
      const evidence = path.join(env.dataDir, 'evidence', claimed[0]!.episodeId, 'attempt-1', 'workspace', 'uid.txt');
      expect((await readFile(evidence, 'utf8')).trim()).toBe('1000');
      // A warm one is ready again, hardened as any sandbox.
      const [warm] = await waitFor('a warm sandbox', async () => {
        const list = (await pooled('pool-w')).filter((c) => c.State === 'running');
        return list.length === 1 ? list : undefined;
      }, 30_000, 200);
      const info = await docker.getContainer(warm!.Id).inspect();
      expect(info.HostConfig.NetworkMode).toBe('none');
      expect(info.HostConfig.CapDrop).toEqual(['ALL']);
      expect(info.HostConfig.Memory).toBe(512 * 1024 * 1024);
      expect(info.Config.Labels[LABEL.episode]).toBeUndefined();
    } finally {
      await worker.close();
    }
    expect(await pooled('pool-w')).toEqual([]);
  });

  it('seeds warm sandboxes with a task\'s workspace while more of it wait, never another task\'s, and gives the place back after its last', async () => {
    const worker: WorkerHandle = await startEnvWorker(env, 'pool-seed', { concurrency: 1, sandboxPool: 1 });
    const seededTask = (id: string) => ({
      yaml: `id: ${id}\ninstruction: copy seed.txt\nverify:\n  command: grep -qx ${id} seen.txt && grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 120\nreserves: { setupSec: 30, closeSec: 20 }\n`,
      // Big enough that a command agent's sandboxes are seeded with it (a small one its exec unpacks itself).
      files: { 'workspace/state.txt': 'broken\n', 'workspace/seed.txt': `${id}\n`, 'workspace/filler.txt': 'x'.repeat(SEED_COMMAND_MIN_BYTES), 'tests/.keep': '' },
    });
    try {
      // The agent passes only on its own task's workspace as the task wrote it (state.txt still broken),
      // however it came in: seeded, written before the start, or unpacked by its own exec. It takes a
      // second, so that a warm sandbox is made meanwhile on a loaded engine.
      const file = await writeBatch('tasks: [tasks]\nsamples: 3\nagent: { kind: command, command: "grep -qx broken state.txt && cat seed.txt > seen.txt && sleep 1 && echo fixed > state.txt" }\n', {
        alpha: seededTask('alpha'), beta: seededTask('beta'),
      });
      const plan = await enqueueFile(env, file);
      const results = await waitForResults(env, plan.batchId, 6);
      const shown = JSON.stringify(results.map((r) => [r.episodeId, r.status, r.sandbox]));
      for (const r of results) expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1 });
      const seeded = results.filter((r) => r.sandbox?.seeded === true);
      // A task's first sample cannot find its workspace seeded (nothing had seen the task yet); the
      // next ones, one at a time, find it so.
      expect(seeded.map((r) => r.sample), shown).not.toContain(0);
      expect(seeded.length, shown).toBeGreaterThanOrEqual(3);
      for (const r of seeded) expect(r.sandbox?.pooled, shown).toBe(true);
      expect(new Set(results.map((r) => r.sandbox!.containerId)).size).toBe(6);
      // After beta's last sample the pool holds one warm sandbox for any task: no task's workspace in it.
      const [warm] = await waitFor('one warm sandbox', async () => {
        const list = (await pooled('pool-seed')).filter((c) => c.State === 'running');
        return list.length === 1 ? list : undefined;
      }, 30_000, 200);
      expect(await sandboxHasFile(warm!.Id, '/workspace/seed.txt')).toBe(false);
      expect(await sandboxHasFile(warm!.Id, '/tests')).toBe(true);
    } finally {
      await worker.close();
    }
    expect(await pooled('pool-seed')).toEqual([]);
  });

  it('gives an llm episode\'s proxy the claimed sandbox\'s own folder', async () => {
    const stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0, host: '127.0.0.1' }, log: silentLog });
    const worker = await startEnvWorker(env, 'pool-llm', {
      concurrency: 1, sandboxPool: 1,
      model: { baseUrl: stub.baseUrl!, maxCalls: 20, maxTokens: 200_000, requestTimeoutMs: 30_000, upstreamRetries: 2 },
    });
    try {
      const file = await writeBatch(`tasks: [${JSON.stringify(path.join(EXAMPLE_TASKS, 'fix-greeting'))}]\nsamples: 3\nagent: { kind: llm, maxTurns: 10 }\n`, {});
      const plan = await enqueueFile(env, file);
      const results = await waitForResults(env, plan.batchId, 3, 120_000);
      for (const r of results) expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1 });
      expect(results.some((r) => r.sandbox?.pooled)).toBe(true);
    } finally {
      await worker.close();
      await stub.close();
    }
  });

  it('leaves no pooled sandbox behind a worker killed with -9 once the reaper ran, salvaging the claimed one as its episode\'s', async () => {
    const fast = { FLEET_LEASE_TTL_MS: '2000', FLEET_REAPER_INTERVAL_MS: '1000', FLEET_LOCK_DURATION_MS: '4000', FLEET_SANDBOX_POOL: '3' };
    const victim = spawnWorker({ ...env.env, ...fast }, 'pool-victim', 1);
    processes.push(victim);
    // One episode makes the worker fill its pool for the kind.
    const first = await enqueueFile(env, await writeBatch('name: pool-first\ntasks: [tasks]\nagent: { kind: command, command: "echo fixed > state.txt" }\n', { k: task('k') }));
    await waitForResults(env, first.batchId, 1);
    await waitFor('a full pool', async () => (await pooled('pool-victim')).filter((c) => c.State === 'running').length === 3, 60_000, 200);
    // The next one runs in a warm sandbox, and the worker dies under it.
    const slow = await enqueueFile(env, await writeBatch('name: pool-slow\ntasks: [tasks]\nagent: { kind: command, command: "echo work > notes.txt; sleep 8; echo fixed > state.txt" }\n', { k: task('k') }));
    const episodeId = slow.jobs[0]!.episodeId;
    const claim = await waitFor('the warm sandbox claimed', async () => {
      for (const c of await pooled('pool-victim')) {
        const record = await env.client.get(sandboxClaimKey(env.prefix, c.Id));
        if (record !== null && (await sandboxHasFile(c.Id, '/workspace/notes.txt'))) return { containerId: c.Id, record: JSON.parse(record) as { episodeId: string } };
      }
      return undefined;
    }, 60_000, 100);
    expect(claim.record.episodeId).toBe(episodeId);
    victim.child.kill('SIGKILL');
    const rescuer = spawnWorker({ ...env.env, ...fast, FLEET_SANDBOX_POOL: '0' }, 'pool-rescuer', 1);
    processes.push(rescuer);
    // Two sightings of the missing lease, the rescuer's start, a salvage and the removals: on a loaded
    // engine (a compose stack beside it in a full run) that took more than 30 s once.
    await waitFor('the dead worker\'s pool reaped', async () => (await pooled('pool-victim')).length === 0, 90_000, 200);
    // The claimed sandbox's workspace was kept as its episode's evidence; the unclaimed ones kept none.
    const folders = await readdir(path.join(env.dataDir, 'evidence', episodeId));
    const salvaged = folders.find((f) => f.startsWith('salvaged-'));
    expect(salvaged, folders.join(',')).toBeDefined();
    expect(await readFile(path.join(env.dataDir, 'evidence', episodeId, salvaged!, 'notes.txt'), 'utf8')).toBe('work\n');
    expect((await readdir(path.join(env.dataDir, 'evidence'))).filter((f) => f.startsWith('salvaged-'))).toEqual([]);
    expect(await env.client.exists(sandboxClaimKey(env.prefix, claim.containerId))).toBe(0);
    // And the episode still ends, once, on the rescuer.
    const [result] = await waitForResults(env, slow.batchId, 1, 90_000);
    expect(result).toMatchObject({ status: 'passed', attempts: 2, workerId: 'pool-rescuer' });
  }, 240_000);

  it('runs a Harbor task\'s episodes in warm sandboxes of its built image, made as its own: ENTRYPOINT and USER kept, /logs made', async () => {
    // This worker alone takes the episodes: the workers an earlier test spawned are stopped first.
    await Promise.all(processes.splice(0).map((w) => w.stop()));
    const worker = await startEnvWorker(env, 'pool-harbor', { concurrency: 1, sandboxPool: 1 });
    try {
      // healthy-server: an ENTRYPOINT that starts the task's server, and a healthcheck waiting for it.
      const task = path.join(ROOT, 'test/fixtures/harbor/healthy-server');
      const batch = async (name: string, samples: number) => {
        const plan = await enqueueFile(env, await writeBatch(`name: ${name}\ntasks: [${JSON.stringify(task)}]\nsamples: ${samples}\nagent: { kind: oracle }\n`, {}));
        const results = await waitForResults(env, plan.batchId, samples, 300_000);
        for (const r of results) expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1, provenance: { environment: { source: 'built' } } });
        return results;
      };
      // The first episode builds the image (or finds it built) and finds no warm sandbox of it: the
      // pool learns the kind from that claim and makes one.
      const [first] = await batch('pool-harbor-first', 1);
      expect(first).toMatchObject({ workerId: 'pool-harbor', sandbox: { pooled: false } });
      const [warm] = await waitFor('a warm Harbor sandbox', async () => {
        const list = (await pooled('pool-harbor')).filter((c) => c.State === 'running');
        return list.length === 1 ? list : undefined;
      }, 60_000, 200);
      // Made as the episode's own would be: the image's ENTRYPOINT and USER kept, the keep-alive its argument.
      const info = await docker.getContainer(warm!.Id).inspect();
      // Created from the image with /logs in it (prepared once per engine), over the task's own.
      expect(info.Image).not.toBe(first!.provenance.imageId);
      expect((await docker.getImage(info.Image).inspect()).Parent).toBe(first!.provenance.imageId);
      expect(info.Config.Entrypoint).toEqual(['/usr/local/bin/entrypoint.sh']);
      expect(info.Config.Cmd).toEqual([expect.stringMatching(/\/bin\/keep-alive$/)]);
      // The keep-alive runs (the ENTRYPOINT exec'd it) and holds next to nothing of the task's memory.
      const top = await docker.getContainer(warm!.Id).top({ ps_args: '-o pid,rss,args' }) as { Processes: string[][] };
      const keepAlive = top.Processes.find((p) => p[2]!.endsWith('/bin/keep-alive'));
      expect(keepAlive, JSON.stringify(top.Processes)).toBeDefined();
      expect(Number(keepAlive![1])).toBeLessThan(1024); // KiB
      expect(info.Config.User).toBe('');
      expect(info.HostConfig.NetworkMode).toBe('none');
      expect(info.HostConfig.CapDrop).toEqual(['ALL']);
      expect(info.HostConfig.CapAdd).toContain('CHOWN');
      expect(info.Config.Labels[LABEL.episode]).toBeUndefined();
      // /logs made before any claim, writable by whoever the agent runs as (a ready one has them).
      for (const dir of ['/logs/agent', '/logs/verifier', '/logs/artifacts']) {
        const mode = await tarModeOf(await docker.getContainer(warm!.Id).getArchive({ path: dir }) as unknown as NodeJS.ReadableStream);
        expect(mode.toString(8), dir).toBe('777');
      }
      // The next episode claims that very sandbox, and passes in it (its healthcheck still run, after the claim).
      const results = await batch('pool-harbor-next', 2);
      const claimed = results.filter((r) => r.sandbox?.pooled);
      expect(claimed.map((r) => r.sandbox!.containerId), JSON.stringify(results.map((r) => r.sandbox))).toContain(warm!.Id);
      expect(new Set([first!, ...results].map((r) => r.sandbox!.containerId)).size).toBe(3);
    } finally {
      await worker.close();
    }
    expect(await pooled('pool-harbor')).toEqual([]);
  }, 360_000);

  it('drops the warm sandboxes of a runtime generation no longer used', async () => {
    const pool = new SandboxPool({ docker, log: silentLog, callTimeoutMs: 30_000, redis: env.client, prefix: env.prefix, workerId: 'pool-gen', size: 1, runDir: path.join(env.dataDir, 'run') });
    const volumes = [`${env.prefix}-gen-a`, `${env.prefix}-gen-b`];
    for (const name of volumes) await docker.createVolume({ Name: name, Labels: { [LABEL.prefix]: env.prefix } });
    const spec = (volume: string) => ({ image: 'rollout-fleet/sandbox:busybox', workdir: '/workspace', limits: { memoryMb: 64, cpus: 0.5, pids: 32 }, mounts: [{ volumeName: volume, target: '/opt/rollout-fleet' }] });
    const owner = { fleet: env.prefix, episodeId: 'e.t.0', batchId: 'e', workerId: 'pool-gen', attempt: 1 };
    try {
      expect(await pool.claim(spec(volumes[0]!), owner, AbortSignal.timeout(10_000))).toBeUndefined();
      await waitFor('a warm sandbox on generation a', async () => pool.readyCount === 1, 30_000, 100);
      const [onA] = await pooled('pool-gen');
      // A claim on generation b: a's warm sandbox is of no use any more and is removed.
      expect(await pool.claim(spec(volumes[1]!), owner, AbortSignal.timeout(10_000))).toBeUndefined();
      await waitFor('a\'s warm sandbox removed', async () => (await docker.listContainers({ all: true, filters: { id: [onA!.Id] } })).length === 0, 30_000, 100);
      await waitFor('a warm sandbox on generation b', async () => pool.readyCount === 1, 30_000, 100);
      const claimed = await pool.claim(spec(volumes[1]!), owner, AbortSignal.timeout(10_000));
      expect(claimed).toBeDefined();
      // A hit is refilled when the claimer says its set-up is done with the engine, once.
      expect(pool.warmingCount).toBe(0);
      claimed!.refill();
      claimed!.refill();
      expect(pool.warmingCount).toBe(1);
      expect(JSON.parse((await env.client.get(sandboxClaimKey(env.prefix, claimed!.session.containerId)))!)).toEqual({ episodeId: 'e.t.0', batchId: 'e', attempt: 1 });
      await claimed!.session.remove();
    } finally {
      await pool.drain();
      expect(await pooled('pool-gen')).toEqual([]);
      for (const name of volumes) await docker.getVolume(name).remove().catch(() => undefined);
    }
  });
});
