// Hostile sandboxes, end to end through one in-process worker: agents that fork-bomb, stuff orphans,
// run out of memory, fill the disk, probe the network, the secrets, the sockets and the runtime volume,
// and signal init. Every episode must end with a result of the right kind (a grade the agent cannot
// turn into "not graded"), and a bystander episode running alongside on the same worker passes.
import { readFile } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { enqueueFile, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch, type ScratchTask } from '../helpers/scratch-tasks.ts';

/** A secret in the worker's own environment: nothing may carry it into a sandbox. */
const SECRET = `sk-hostile-${process.pid}-never-in-a-sandbox`;
/** In the instruction, which agents do see: proves the env probe reads what the agent's env holds. */
const CONTROL = `control-${process.pid}`;

/**
 * One task: its workspace carries agent.sh (the batch's one agent runs it), the verifier passes
 * when state.txt says fixed. The verifier forks (a pipeline), as every real test script does. The agent's ceiling is `ceilingSec`; set-up has room for a cold runtime.
 */
function task(id: string, agentScript: string, o: { ceilingSec?: number; limits?: string } = {}): ScratchTask {
  const reserves = { setupSec: 40, verifySec: 10, closeSec: 8 };
  const deadlineSec = reserves.setupSec + reserves.verifySec + reserves.closeSec + (o.ceilingSec ?? 15);
  return {
    yaml: `id: ${id}\ninstruction: write fixed into state.txt (${CONTROL})\nverify:\n  command: cat state.txt | grep -qx fixed\n  timeoutSec: 5\n` +
      `deadlineSec: ${deadlineSec}\nreserves: { setupSec: ${reserves.setupSec}, verifySec: ${reserves.verifySec}, closeSec: ${reserves.closeSec} }\n` +
      `limits: ${o.limits ?? '{ memoryMb: 64, cpus: 0.5, pids: 32 }'}\n`,
    files: { 'workspace/state.txt': 'broken\n', 'workspace/agent.sh': agentScript, 'tests/.keep': '' },
  };
}

describe('hostile sandboxes', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let hostServer: net.Server;
  let hostConnections = 0;
  const byTask = new Map<string, EpisodeResult>();
  const stdoutOf = (taskId: string) => readFile(path.join(env.dataDir, 'evidence', byTask.get(taskId)!.episodeId, 'attempt-1', 'agent.stdout.txt'), 'utf8');

  beforeAll(async () => {
    process.env.MODEL_API_KEY = SECRET;
    env = await startFleetEnv();
    // A service on the host's loopback that counts who reaches it: the witness of the network probe.
    hostServer = net.createServer((sock) => {
      hostConnections += 1;
      sock.end('hello\n');
    });
    await new Promise<void>((resolve) => hostServer.listen(0, '127.0.0.1', resolve));
    const hostPort = (hostServer.address() as net.AddressInfo).port;
    // Every episode at once: each hostile one runs alongside the bystander on the same worker.
    worker = await startEnvWorker(env, 'hostile-w', { concurrency: 7 });

    const tasks: Record<string, ScratchTask> = {
      // A daemon keeps the pid limit full of orphans after the agent exits: once killed, they must not
      // stay zombies holding the verifier's pids.
      // The agent ends when a fork of its own fails (fatal in busybox sh): the limit is reached.
      orphans: task('orphans', "echo fixed > state.txt\nsetsid sh -c 'while :; do (sleep 1000 &) 2>/dev/null; done' </dev/null >/dev/null 2>&1 &\necho orphans=filling\nwhile (true); do :; done\n"),
      // A fork bomb still running at the agent's ceiling: graded as a timeout, never "the verifier could
      // not fork". The agent then becomes a sleep (exec: no fork needed, and SIGCHLD from the bomb is
      // ignored). It used to block reading a FIFO in a loop: under load, the bomb's signals interrupted
      // the FIFO's open, a redirection error that made the shell exit 2 before the ceiling.
      'fork-bomb': task('fork-bomb', 'echo fixed > state.txt\nf() { f | f & }\nf\nexec sleep 100000\n', { ceilingSec: 3 }),
      // A process the kernel OOM-kills (not the container's init): the result must say so, and grade.
      // tail keeps everything it reads (no newline ever comes): 64 MB cannot fit in 32. It volunteers as the
      // OOM killer's victim (oom_score_adj 1000), yet under load the kernel has also taken the agent's shell
      // (a second kill while the first victim's memory was still charged): the state is written first, so
      // either way the verifier decides. The ceiling leaves the pipe time on a loaded machine (0.5 CPU).
      oom: task('oom', 'echo fixed > state.txt\nhead -c 64m /dev/zero | sh -c "echo 1000 > /proc/self/oom_score_adj; exec tail" > /dev/null\necho "tail=$?"\n', { limits: '{ memoryMb: 32, cpus: 0.5, pids: 32 }', ceilingSec: 40 }),
      // 3x the disk limit (bounded, so a broken fix cannot fill the engine's disk), then it would idle.
      disk: task('disk', 'head -c 48m /dev/zero > big.bin\necho fixed > state.txt\nsleep 60\n', { ceilingSec: 30, limits: '{ memoryMb: 64, cpus: 0.5, pids: 32, diskMb: 16 }' }),
      probes: task('probes', [
        'echo "ifaces=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d " " | tr "\\n" ,)"',
        `nc -w 2 127.0.0.1 ${hostPort} </dev/null; echo "host=$?"`,
        `nc -w 2 127.0.0.1 ${env.redis.port} </dev/null; echo "redis=$?"`,
        'echo "env-begin"; env; echo "env-end"',
        'echo "p1env-begin"; tr "\\0" "\\n" < /proc/1/environ; echo "p1env-end"',
        'echo "sockets=$(find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print 2>/dev/null | tr "\\n" ,)"',
        'touch /opt/rollout-fleet/probe; echo "runtime-write=$?"',
        'kill -9 1; echo "kill-9-init=$?"',
        'kill -TERM 1; echo "kill-term-init=$?"',
        'kill -KILL -1; echo "kill-all=$?"',
        'echo fixed > state.txt',
      ].join('\n') + '\n'),
      bystander: task('bystander', 'echo fixed > state.txt\n'),
    };
    const file = await writeBatch('tasks: [tasks]\nagent: { kind: command, command: "sh ./agent.sh" }\n', tasks);
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 180_000);
    for (const r of results) byTask.set(r.taskId, r);
    await waitForNoContainers(plan.batchId);
  }, 240_000);

  afterAll(async () => {
    delete process.env.MODEL_API_KEY;
    await worker?.close();
    hostServer?.close();
    await env?.close();
  });

  it('grades an agent that stuffed the pid limit with orphans (they are reaped, the verifier can fork)', async () => {
    const r = byTask.get('orphans');
    expect(await stdoutOf('orphans')).toContain('orphans=filling');
    expect(r?.agent?.exitCode, `the agent hit the pid limit: ${JSON.stringify(r)}`).toBe(2);
    expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1 });
  });

  it('grades an agent whose fork bomb still runs at its ceiling as a timeout, with its reward', () => {
    const r = byTask.get('fork-bomb');
    // Usually the bomb still runs at the ceiling: a timeout. Under load the agent's own shell may fail a
    // fork of the bomb first (fatal in busybox sh: exit 2) before it reaches its sleep; the bomb still
    // runs, and either way the sweep must leave the verifier its pids: graded, never verifier_crashed.
    if (r?.agent?.timedOut === false) expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1, agent: { exitCode: 2 } });
    else expect(r, JSON.stringify(r)).toMatchObject({ status: 'timeout', reward: 1, agent: { timedOut: true } });
  });

  it('reports an OOM kill of a child process in the sandbox, and still grades the episode', async () => {
    const r = byTask.get('oom');
    // The hog was killed (137), or the kernel took the agent's shell with it (its exit is 137); the
    // container's init was not, so the verifier ran and graded the state the agent wrote.
    const out = await stdoutOf('oom');
    if (r?.agent?.exitCode === 137) expect(out, JSON.stringify(r)).not.toContain('tail=');
    else expect(out, JSON.stringify(r)).toContain('tail=137');
    expect(r, JSON.stringify(r)).toMatchObject({ status: 'passed', reward: 1, oomKilled: true });
  });

  it('stops an agent writing past limits.diskMb within seconds: an agent failure, not a reward', () => {
    const r = byTask.get('disk');
    expect(r, JSON.stringify(r)).toMatchObject({ status: 'error', reward: null, attempts: 1, error: { kind: 'agent', code: 'disk_limit_exceeded' } });
    expect(r!.error!.message).toMatch(/16 MB/);
    // The write takes well under a second; unstopped, the agent would idle to its 30 s ceiling.
    expect(r!.timings.agentMs).toBeLessThan(8_000);
  });

  it('probes find no way out, no secret, no socket, a read-only runtime and an init they cannot signal', async () => {
    const r = byTask.get('probes');
    const out = await stdoutOf('probes');
    expect(out).toContain('ifaces=lo,\n');
    expect(out).toMatch(/^host=[1-9]/m);
    expect(out).toMatch(/^redis=[1-9]/m);
    expect(hostConnections).toBe(0);
    const agentEnv = out.slice(out.indexOf('env-begin'), out.indexOf('env-end'));
    // The control proves the probe read the agent's environment; the secrets are not in it.
    expect(agentEnv).toContain(CONTROL);
    for (const text of [agentEnv, out.slice(out.indexOf('p1env-begin'), out.indexOf('p1env-end'))]) {
      expect(text).not.toContain(SECRET);
      expect(text).not.toMatch(/MODEL_API_KEY|REDIS_URL|FLEET_|DOCKER_HOST/);
    }
    expect(out).toContain('sockets=\n');
    expect(out).toMatch(/^runtime-write=[1-9]/m);
    expect(out).toMatch(/^kill-9-init=[1-9]/m);
    expect(out).toMatch(/^kill-term-init=[1-9]/m);
    // The sandbox survived its agent's signals: the verifier ran in it and passed.
    expect(r, JSON.stringify(r?.error)).toMatchObject({ status: 'passed', reward: 1 });
  });

  it('leaves a bystander episode on the same worker unaffected', () => {
    expect(byTask.get('bystander')).toMatchObject({ status: 'passed', reward: 1, attempts: 1 });
  });
});
