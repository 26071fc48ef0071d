// Sandboxes under gVisor (FLEET_SANDBOX_RUNTIME=runsc, registered by .ci/setup-host.sh): a session and
// a whole episode really run on gVisor's kernel (its version and boot log, not the host's), keep the
// hardening they have under runc (network none: loopback only; no capabilities; the runtime volume
// read-only; memory, CPU and pids limits), an OOM kill (which may take the whole sandbox under gVisor)
// ends the exec at once, and a runtime the engine does not list stops the worker.
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.ts';
import { SandboxSession } from '../../src/sandbox/sandbox-session.ts';
import { enginePidsLimit, resolveSandboxRuntime, type SandboxRuntime } from '../../src/sandbox/sandbox-runtime.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, docker, enqueueFile, fleetContainers, silentLog, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const RUNTIME = 'runsc';
const owner = { fleet: 'gvisor-test', episodeId: `gvisor-test-${process.pid}`, batchId: `gvisor-test-${process.pid}`, workerId: 'gvisor-test', attempt: 1 };
const line = (out: string, key: string) => out.match(new RegExp(`^${key}=(.*)$`, 'm'))?.[1];

/** Prints what tells gVisor from the host kernel, and what the hardening leaves the sandbox. */
const PROBE = [
  'echo "kernel=$(uname -r)"',
  'echo "boot=$(dmesg | head -n 1)"',
  'echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | tr "\\n" ,)"',
  'echo "caps=$(grep CapEff /proc/self/status | tr -d "[:space:]")"',
  'echo "memtotal=$(grep MemTotal /proc/meminfo | tr -s " " | cut -d" " -f2)"',
  // 20 processes at once under a limit of 32: gVisor runs each on host threads of its own, which the
  // engine's pids limit counts; the widened limit must let them all start.
  'n=0; for i in $(seq 1 20); do sleep 30 & n=$((n+1)); done; echo "forked=$n"; kill $(jobs -p) 2>/dev/null; wait',
].join('\n');

describe('sandboxes under gVisor (runsc)', () => {
  let runtime: SandboxRuntime;

  beforeAll(async () => {
    const info = await docker.info() as { Runtimes?: Record<string, unknown> };
    if (!info.Runtimes?.[RUNTIME]) throw new Error(`the engine has no runtime ${RUNTIME}: run .ci/setup-host.sh`);
    runtime = await resolveSandboxRuntime(docker, RUNTIME, { timeoutMs: 30_000 });
  });

  it('a session runs on gVisor\'s kernel with network none, no capabilities and its limits', async () => {
    expect(runtime).toEqual({ name: RUNTIME, gvisor: true });
    const spec = { image: DEFAULT_IMAGE, workdir: '/workspace', limits: { memoryMb: 256, cpus: 0.5, pids: 32 }, owner, runtime };
    const session = await SandboxSession.open({ docker, log: silentLog, callTimeoutMs: 30_000 }, spec, () => undefined);
    try {
      const probe = await session.exec(PROBE, { timeoutMs: 20_000, capBytes: 64 * 1024 });
      const out = probe.stdout.text;
      expect(probe.exitCode, out + probe.stderr.text).toBe(0);
      // gVisor's Sentry answers as Linux 4.4.0 and boots with its own log; the host's kernel is another.
      expect(line(out, 'kernel')).not.toBe(os.release());
      expect(line(out, 'boot'), out).toContain('Starting gVisor');
      expect(line(out, 'ifaces')).toBe('lo,');
      expect(line(out, 'caps')).toBe('CapEff:0000000000000000');
      // gVisor reports the container's memory limit as the machine's memory.
      expect(Number(line(out, 'memtotal'))).toBe(256 * 1024);
      expect(line(out, 'forked')).toBe('20');

      const info = await docker.getContainer(session.containerId).inspect();
      expect(info.HostConfig).toMatchObject({
        Runtime: RUNTIME, NetworkMode: 'none', CapDrop: ['ALL'], SecurityOpt: ['no-new-privileges'],
        Memory: 256 * 1024 * 1024, NanoCpus: 5e8, PidsLimit: enginePidsLimit(32, runtime),
      });
      expect(enginePidsLimit(32, runtime)).toBeGreaterThan(32);
      expect(enginePidsLimit(32, undefined)).toBe(32);
    } finally {
      await session.remove();
    }
  }, 60_000);

  it('an OOM kill under gVisor ends the running exec at once, not at its timeout, and is seen as an OOM kill', async () => {
    const spec = { image: DEFAULT_IMAGE, workdir: '/workspace', limits: { memoryMb: 128, cpus: 1, pids: 32 }, owner, runtime };
    const session = await SandboxSession.open({ docker, log: silentLog, callTimeoutMs: 30_000 }, spec, () => undefined);
    try {
      // tail keeps what it reads (no newline comes): 300 MB cannot fit in 128 MB.
      const hog = await session.exec('head -c 400m /dev/zero | tail -c 300m > /dev/null; echo "tail=$?"', { timeoutMs: 45_000, capBytes: 4096 });
      // Ended with the sandbox, not at its timeout: no exit code, or runsc's own failure (128) when its
      // wait on the dead sandbox answered first; never the shell's own end.
      expect(hog, JSON.stringify(hog)).toMatchObject({ timedOut: false, aborted: false });
      expect(hog.exitCode === null || hog.exitCode >= 128, JSON.stringify(hog)).toBe(true);
      expect(hog.stdout.text).not.toContain('tail=');
      // Which process gVisor's OOM kill takes depends on the host (its cgroup set-up and runsc's
      // version): here the whole sandbox, its init included; on another machine only the hog, the
      // sandbox running on. Either way the kill is seen, and a dead sandbox is one whose init was killed.
      const state = await session.state();
      expect(state.oomKilled, JSON.stringify(state)).toBe(true);
      if (!state.running) expect(state.initOomKilled, JSON.stringify(state)).toBe(true);
    } finally {
      await session.remove();
    }
  }, 90_000);

  describe('an episode of a worker with FLEET_SANDBOX_RUNTIME=runsc', () => {
    let env: FleetEnv;
    let worker: WorkerHandle;

    beforeAll(async () => {
      env = await startFleetEnv();
      // With a pool: the first episode of a kind creates its own sandbox, the next claims a warm one.
      worker = await startEnvWorker(env, 'gvisor-w', { sandboxRuntime: RUNTIME, sandboxPool: 1 });
    });
    afterAll(async () => {
      await worker?.close();
      await env?.close();
    });

    it('runs on gVisor (its own sandbox each time: no warm pool under runsc), records the runtime in its provenance, keeps the runtime volume read-only, and is graded', async () => {
      // The probe's lines go to a workspace file (kept as evidence): under gVisor on a loaded engine the
      // last lines of an exec's stdout were seen lost at its end.
      const agent = `{\n${PROBE}\ntouch /opt/rollout-fleet/probe; echo "runtime-write=$?"\n} > probe.txt 2>&1\necho fixed > state.txt\n`;
      // Another task id each time (a batch of the same tasks is the same batch): the same kind of sandbox.
      const batchOf = (id: string) => writeBatch('tasks: [tasks]\nagent: { kind: command, command: "sh ./agent.sh" }\n', {
        [id]: {
          yaml: `id: ${id}\n` + 'instruction: write fixed into state.txt\nverify:\n  command: cat state.txt | grep -qx fixed\n  timeoutSec: 10\n' +
            'deadlineSec: 90\nreserves: { setupSec: 40, verifySec: 15, closeSec: 10 }\nlimits: { memoryMb: 256, cpus: 0.5, pids: 32 }\n',
          files: { 'workspace/state.txt': 'broken\n', 'workspace/agent.sh': agent, 'tests/.keep': '' },
        },
      });
      const runOne = async (id: string) => {
        const plan = await enqueueFile(env, await batchOf(id));
        const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
        await waitForNoContainers(plan.batchId);
        // The attempt that passed (under load the runtime was seen to exit under a sandbox: an infra error, retried).
        const out = await readFile(path.join(env.dataDir, 'evidence', result!.episodeId, `attempt-${result!.attempts}`, 'workspace', 'probe.txt'), 'utf8');
        expect(result, JSON.stringify(result)).toMatchObject({ status: 'passed', reward: 1, provenance: { sandboxRuntime: RUNTIME } });
        expect(line(out, 'boot'), out).toContain('Starting gVisor');
        expect(line(out, 'kernel')).not.toBe(os.release());
        expect(line(out, 'ifaces')).toBe('lo,');
        expect(line(out, 'caps')).toBe('CapEff:0000000000000000');
        expect(Number(line(out, 'memtotal'))).toBe(256 * 1024);
        expect(line(out, 'forked')).toBe('20');
        expect(line(out, 'runtime-write')).toMatch(/^[1-9]/);
        return result!;
      };
      expect((await runOne('probe-own')).sandbox?.pooled).toBe(false);
      // The warm pool is off under gVisor (the worker asked for one): the next episode of the same kind
      // gets its own sandbox too, and no warm one was ever made.
      expect((await runOne('probe-again')).sandbox?.pooled).toBe(false);
      expect(await fleetContainers('pool', 'gvisor-w')).toEqual([]);
    }, 180_000);

    it('grades a Harbor task (a root sandbox whose /tests the fleet replaces after the agent) under runsc', async () => {
      // gVisor's default file cache would not see /tests written through the engine: --file-access=shared.
      const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-harbor-'));
      const file = path.join(dir, 'batch.yaml');
      await writeFile(file, `tasks: ${JSON.stringify([path.join(ROOT, 'test/fixtures/harbor/hello-file')])}\nagent: { kind: oracle }\n`);
      const plan = await enqueueFile(env, file);
      const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
      expect(result, JSON.stringify(result)).toMatchObject({ status: 'passed', reward: 1, provenance: { sandboxRuntime: RUNTIME } });
    }, 150_000);
  });

  it('refuses a runtime the engine does not list, and a malformed name, naming the setting and the value', async () => {
    const env = await startFleetEnv();
    try {
      const start = startEnvWorker(env, 'gvisor-bad', { sandboxRuntime: 'no-such-runtime' });
      await expect(start).rejects.toBeInstanceOf(ConfigError);
      await expect(start).rejects.toThrow(/FLEET_SANDBOX_RUNTIME: the engine has no runtime "no-such-runtime" \(it has .*runsc/);
    } finally {
      await env.close();
    }
    expect(() => loadConfig({ FLEET_SANDBOX_RUNTIME: 'run sc;' })).toThrow(/FLEET_SANDBOX_RUNTIME/);
    expect(loadConfig({ FLEET_SANDBOX_RUNTIME: RUNTIME }).FLEET_SANDBOX_RUNTIME).toBe(RUNTIME);
  });
});
