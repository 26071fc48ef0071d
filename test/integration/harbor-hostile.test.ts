// Harbor tasks whose "solution" is a hostile root agent (test/fixtures/harbor-hostile): it plants
// reward files, links /logs/verifier or /tests elsewhere, leaves processes (setsid, nohup, double forks,
// renamed) to plant them later, poisons the keep-alive and the ENTRYPOINT the restart runs again, probes
// the ways out of its container, exhausts pids, memory and disk, and kills PID 1. What docs/HARBOR.md
// promises must hold (a planter left running is stopped under agentProcesses: stop only): a reward comes only from the real test, nothing leaves the sandbox, every episode
// ends with a grade or an error with a kind, nothing is left behind, and the worker goes on grading.
import { readFile, readdir, stat, mkdtemp, writeFile } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../src/episode/episode-job.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { ROOT, enqueueFile, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';

const FIXTURES = path.join(ROOT, 'test/fixtures/harbor-hostile');

/** Solutions that never write the answer, only try to plant a reward: the test writes none for them. */
const CHEATS = [
  'verifier-link-to-tests', 'verifier-link-to-root', 'logs-link', 'daemons', 'tests-planted', 'tests-shadow-module', 'tests-link',
  'tests-script-link', 'resurrect-sleep',
];

/** Size of a folder's files, recursively (bytes). */
async function folderBytes(dir: string): Promise<number> {
  let total = 0;
  for (const entry of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (entry.isFile()) total += (await stat(path.join(entry.parentPath, entry.name))).size;
  }
  return total;
}

describe('Harbor tasks against a hostile root agent', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;
  let witness: net.Server;
  let witnessConnections = 0;

  beforeAll(async () => {
    env = await startFleetEnv();
    // A service on every interface of the host that counts who reaches it: the network probes aim at it
    // (loopback, the bridge gateway, host.docker.internal).
    witness = net.createServer((sock) => {
      witnessConnections += 1;
      sock.end('hello\n');
    });
    await new Promise<void>((resolve) => witness.listen(0, '0.0.0.0', resolve));
    // The escape-probes task's [environment].env names these; they are resolved where the batch is enqueued.
    process.env.HARBOR_HOSTILE_REDIS_PORT = String(env.redis.port);
    process.env.HARBOR_HOSTILE_WITNESS_PORT = String((witness.address() as net.AddressInfo).port);
    worker = await startEnvWorker(env, 'harbor-hostile-w', { concurrency: 4 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
    await new Promise((resolve) => witness?.close(resolve));
  });

  async function run(ids: string[], more = ''): Promise<Map<string, EpisodeResult>> {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-harbor-hostile-'));
    const file = path.join(dir, 'batch.yaml');
    await writeFile(file, `tasks: ${JSON.stringify(ids.map((id) => path.join(FIXTURES, id)))}\nagent: { kind: oracle }\nsamples: 1\n${more}`);
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 240_000);
    // Whatever the agents did to their sandboxes, none is left behind.
    await waitForNoContainers(plan.batchId, 60_000);
    return new Map(results.map((r) => [r.taskId, r]));
  }
  const evidenceFiles = (r: EpisodeResult) => readdir(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1'), { recursive: true }).catch(() => [] as string[]);
  /** The oracle's log (HARBOR.md: /logs/agent/oracle.txt, kept as evidence), else what the evidence holds. */
  const agentLog = async (r: EpisodeResult) => {
    const files = await evidenceFiles(r);
    const log = files.find((f) => f.endsWith('oracle.txt'));
    return log ? readFile(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1', log), 'utf8') : `(no oracle.txt among ${files.join(', ')})`;
  };
  let cheats: Map<string, EpisodeResult> | undefined;
  /** Graded (a reward from the verifier or the agent's timeout), or an error that names its kind. */
  function endedWell(id: string, r: EpisodeResult | undefined) {
    expect(r, `${id}: no result`).toBeDefined();
    const ok = ['passed', 'failed', 'timeout'].includes(r!.status) || (r!.status === 'error' && !!r!.error?.kind && r!.reward === null);
    expect(ok, `${id} ended as ${JSON.stringify(r)}`).toBe(true);
  }

  /** The cheats that got a reward in `byTask` (the real test writes none for a wrong answer: the only honest end is reward_file_missing). */
  async function fooledIn(byTask: Map<string, EpisodeResult>, ids: readonly string[]): Promise<string[]> {
    const fooled: string[] = [];
    for (const id of ids) {
      const r = byTask.get(id)!;
      if (r.reward !== null || r.status !== 'error' || r.error?.code !== 'reward_file_missing') {
        fooled.push(`${id}: ${JSON.stringify({ status: r.status, reward: r.reward, metrics: r.metrics, error: r.error })}\n  agent log: ${(await agentLog(r)).slice(0, 600)}`);
      }
    }
    return fooled;
  }

  it('with the agent\'s processes stopped (agentProcesses: stop): a planted reward, a link for /logs/verifier or /tests, a left-behind or resurrected planter: no reward but the real test\'s', async () => {
    const byTask = await run(['honest', ...CHEATS, 'tests-file'], 'agentProcesses: stop\n');
    cheats = byTask;
    // The control: the same verifier passes a right answer, so the cheats below fail only for cheating.
    expect(byTask.get('honest'), JSON.stringify(byTask.get('honest'))).toMatchObject({ status: 'passed', reward: 1 });
    const fooled = await fooledIn(byTask, CHEATS);
    expect(fooled, `FOOLED:\n${fooled.join('\n')}`).toEqual([]);
    // /tests a plain file: the tests cannot be copied in; an error of a kind, never a reward.
    const file = byTask.get('tests-file')!;
    expect(file, JSON.stringify(file)).toMatchObject({ status: 'error', reward: null });
    expect(file.error?.kind, JSON.stringify(file)).toBeTruthy();
  }, 300_000);

  it('with the agent\'s processes kept (Harbor\'s way, the default): every cheat but a root planter left running gets no reward either', async () => {
    // A root agent's process that keeps writing the reward file wins here, as under Harbor (docs/HARBOR.md).
    const kept = CHEATS.filter((id) => id !== 'daemons');
    const byTask = await run(['honest', ...kept, 'tests-file']);
    expect(byTask.get('honest'), JSON.stringify(byTask.get('honest'))).toMatchObject({ status: 'passed', reward: 1 });
    const fooled = await fooledIn(byTask, kept);
    expect(fooled, `FOOLED:\n${fooled.join('\n')}`).toEqual([]);
    expect(byTask.get('tests-file'), JSON.stringify(byTask.get('tests-file'))).toMatchObject({ status: 'error', reward: null });
  }, 300_000);

  it('the evidence keeps /logs/agent and /logs/verifier, as HARBOR.md says, for the honest agent and the cheats alike', async () => {
    expect(cheats, 'the first test ran').toBeDefined();
    for (const id of ['honest', 'daemons', 'verifier-link-to-tests']) {
      const files = await evidenceFiles(cheats!.get(id)!);
      expect(files.some((f) => f.endsWith('oracle.txt')), `${id}: no oracle.txt in the evidence: ${files.join(', ')}`).toBe(true);
      expect(files.some((f) => f.endsWith('test-stdout.txt')), `${id}: no test-stdout.txt in the evidence: ${files.join(', ')}`).toBe(true);
    }
  });

  it('escape probes, pid, memory and disk exhaustion and a killed PID 1: all blocked or ended with a kind, and the worker goes on', async () => {
    const byTask = await run(['escape-probes', 'fork-bomb', 'memory-hog', 'disk-fill', 'zombies', 'kill-all', 'kill-init', 'honest']);
    const probes = byTask.get('escape-probes')!;
    const log = await readFile(path.join(env.dataDir, 'evidence', probes.episodeId, 'attempt-1', 'workspace', 'probe-details.txt'), 'utf8').catch((err: Error) => `(no probe details: ${err.message})`);
    expect(probes, `${JSON.stringify(probes)}\n${log}`).toMatchObject({ status: 'passed', reward: 1 });
    // Every probe wrote 1 when its attack was blocked; the ones that worked, named with what they reached.
    const metrics = probes.metrics ?? {};
    expect(Object.keys(metrics).length, JSON.stringify(metrics)).toBeGreaterThan(30);
    const worked = Object.entries(metrics).filter(([k, v]) => k !== 'reward' && v !== 1).map(([k]) => k);
    expect(worked, `attacks that WORKED: ${worked.join(', ')}\n${log.split('\n').filter((l) => !l.startsWith('  ')).join('\n')}`).toEqual([]);
    // Nothing from a sandbox reached the host's witness service.
    expect(witnessConnections).toBe(0);

    for (const id of ['fork-bomb', 'memory-hog', 'disk-fill', 'zombies', 'kill-all', 'kill-init']) endedWell(id, byTask.get(id));
    // Each of these wrote the right answer before its attack: a grade they get can only be the real one.
    for (const id of ['fork-bomb', 'memory-hog', 'disk-fill', 'zombies', 'kill-all', 'kill-init']) {
      const r = byTask.get(id)!;
      if (r.reward !== null) expect([0, 1], `${id}: ${JSON.stringify(r)}`).toContain(r.reward);
    }
    // The bystander in the same batch, on the same worker, passed.
    expect(byTask.get('honest'), JSON.stringify(byTask.get('honest'))).toMatchObject({ status: 'passed', reward: 1 });
    // The disk filler's 256 MB in /logs/agent: kept as evidence, or not, but measured.
    const diskEvidence = await folderBytes(path.join(env.dataDir, 'evidence', byTask.get('disk-fill')!.episodeId)).catch(() => -1);
    console.log(`hostile results:\n${[...byTask].map(([id, r]) => `  ${id}: ${JSON.stringify({ status: r.status, reward: r.reward, error: r.error, oomKilled: r.oomKilled, agent: r.agent })}`).join('\n')}\n  disk-fill evidence bytes: ${diskEvidence}`);

    // After all of it, a normal task on the same worker still passes.
    const after = await run(['honest']);
    expect(after.get('honest'), JSON.stringify(after.get('honest'))).toMatchObject({ status: 'passed', reward: 1 });
  }, 360_000);
});
