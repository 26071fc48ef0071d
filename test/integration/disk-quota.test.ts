// A sandbox's disk limit enforced by the engine itself (StorageOpt size), on a private second engine
// whose data root can enforce it (btrfs on a loop file): the agent's write fails at the limit, the
// layer never grows past it, and the episode ends as where the limit is watched: kind agent,
// disk_limit_exceeded (the full quota leaves no room for the tests). The shared engine (overlay2 on
// ext4) refuses the option, and each engine's answer is remembered for that engine only.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { createDiskQuota } from '../../src/sandbox/disk-quota.ts';
import { SandboxSession } from '../../src/sandbox/sandbox-session.ts';
import { docker, enqueueFile, fleetContainers, silentLog, startEnvWorker, startFleetEnv, waitFor, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { createSecondEngine, type SecondEngine } from '../helpers/second-engine.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const MB = 1024 * 1024;

describe('disk limit enforced by the engine (StorageOpt size)', () => {
  let env: FleetEnv;
  let engine: SecondEngine;
  let worker: WorkerHandle | undefined;

  beforeAll(async () => {
    env = await startFleetEnv();
    // 1 GB, sparse: the runtime generation (~100 MB) and a few sandboxes fit.
    engine = await createSecondEngine({ quotaDataRootMb: 1024 });
  }, 120_000);
  afterAll(async () => {
    await worker?.close();
    await engine?.destroy();
    await env?.close();
  });

  it('fails the agent\'s write at limits.diskMb, never past it: an agent failure, not a reward', async () => {
    worker = await startEnvWorker(env, 'quota-w', { docker: engine.docker, concurrency: 1 });
    // 3x the limit (bounded, so a broken fix cannot fill the engine's disk). state.txt is fixed only
    // if the whole write succeeded: with the quota the verifier fails, without it the agent passes
    // (or, if the engine did not enforce it, the watch stops it as disk_limit_exceeded).
    const agent = 'if dd if=/dev/zero of=big.bin bs=1M count=48 2>&1; then echo fixed > state.txt; fi; echo "bytes=$(stat -c %s big.bin)"';
    const file = await writeBatch(`tasks: [tasks]\nagent: { kind: command, command: ${JSON.stringify(agent)} }\n`, {
      quota: {
        yaml: 'id: quota\ninstruction: x\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 5\ndeadlineSec: 120\n' +
          'reserves: { setupSec: 60, verifySec: 10, closeSec: 15 }\nlimits: { memoryMb: 64, cpus: 0.5, pids: 32, diskMb: 16 }\n',
        files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
      },
    });
    const plan = await enqueueFile(env, file);
    // The sandbox is created with the quota (seen on the engine while it exists).
    const storageOpt = await waitFor('the episode\'s sandbox on the second engine', async () => {
      const [c] = await fleetContainers('batch', plan.batchId, engine.docker);
      if (c === undefined) return undefined;
      const info = await engine.docker.getContainer(c.Id).inspect().catch(() => undefined);
      return info && { storageOpt: info.HostConfig.StorageOpt };
    }, 90_000, 100);
    expect(storageOpt).toEqual({ storageOpt: { size: '16M' } });

    const [r] = await waitForResults(env, plan.batchId, 1, 120_000);
    const stdout = await readFile(path.join(env.dataDir, 'evidence', r!.episodeId, 'attempt-1', 'agent.stdout.txt'), 'utf8');
    // The kernel refused the write at the quota (btrfs answers EDQUOT; xfs project quotas ENOSPC).
    expect(stdout, JSON.stringify(r)).toMatch(/Disk quota exceeded|No space left on device/);
    const bytes = Number(/^bytes=(\d+)$/m.exec(stdout)?.[1]);
    expect(bytes).toBeGreaterThan(8 * MB);
    expect(bytes).toBeLessThanOrEqual(16 * MB);
    console.info(`disk quota: the agent's write stopped at ${bytes} bytes of its 16 MB limit; agent ${r!.timings.agentMs} ms`);
    // The agent was not stopped (its own write failed and it went on), but its full disk leaves no room
    // for the tests: its failure, final, never an infrastructure retry nor a reward.
    expect(r, JSON.stringify(r)).toMatchObject({
      status: 'error', reward: null, attempts: 1, agent: { exitCode: 0, timedOut: false },
      error: { kind: 'agent', code: 'disk_limit_exceeded' },
    });
    expect(r!.error!.message).toMatch(/16 MB \(enforced by the engine\)/);
    // The engine's acceptance is remembered: its sandboxes keep asking for the quota.
    expect(createDiskQuota(engine.docker, 16)).toEqual({ size: '16M' });
    await waitFor('the sandbox removed', async () => (await fleetContainers('batch', plan.batchId, engine.docker)).length === 0, 30_000, 200);
  }, 240_000);

  it('remembers per engine: the shared engine refuses, the quota engine still enforces', async () => {
    const deps = (d: typeof docker) => ({ docker: d, log: silentLog, callTimeoutMs: 30_000 });
    const spec = (episodeId: string) => ({
      image: 'rollout-fleet/sandbox:busybox', workdir: '/tmp', limits: { memoryMb: 64, cpus: 0.5, pids: 32, diskMb: 16 },
      owner: { fleet: env.prefix, episodeId, batchId: 'quota-probe', workerId: 'quota-test', attempt: 1 },
    });
    const sessions: SandboxSession[] = [];
    try {
      const shared = await SandboxSession.open(deps(docker), spec('probe-shared'), () => undefined);
      sessions.push(shared);
      expect(shared.diskEnforced).toBe(false);
      expect(createDiskQuota(docker, 16)).toBeUndefined();
      const quota = await SandboxSession.open(deps(engine.docker), spec('probe-quota'), () => undefined);
      sessions.push(quota);
      expect(quota.diskEnforced).toBe(true);
      const info = await engine.docker.getContainer(quota.containerId).inspect();
      expect(info.HostConfig.StorageOpt).toEqual({ size: '16M' });
    } finally {
      for (const s of sessions) await s.remove();
    }
  }, 60_000);
});
