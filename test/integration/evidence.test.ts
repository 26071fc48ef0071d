// Evidence from a hostile sandbox: links and odd names in its workspace cannot make extraction write
// outside the episode's folder, and 1 GB of output costs neither the disk nor the worker's memory.
import { lstat, readFile, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv, startEnvWorker, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const OUTPUT_CAP = 256 * 1024;

describe('evidence', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'evidence-w', { concurrency: 1, callTimeoutMs: 30_000, outputCapBytes: OUTPUT_CAP });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  it('keeps links and traversal out of the evidence folder, and 1 GB of output out of disk and memory', async () => {
    const agent = [
      'echo fixed > state.txt',
      'ln -s / rootlink',
      'ln -s ../../../../../../tmp uplink',
      'mkdir -p "a/..b" && echo odd > "a/..b/c.txt"',
      'head -c 1000000000 /dev/zero',
    ].join('; ');
    const file = await writeBatch(`tasks: [tasks]\nagent: { kind: command, command: ${JSON.stringify(agent)} }\n`, {
      hostile: {
        yaml: 'id: hostile\ninstruction: x\nverify:\n  command: grep -qx fixed state.txt\n  timeoutSec: 10\ndeadlineSec: 300\n',
        files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
      },
    });
    const rssBefore = process.memoryUsage().rss;
    const plan = await enqueueFile(env, file);
    const [result] = await waitForResults(env, plan.batchId, 1, 180_000);
    expect(result).toMatchObject({ status: 'passed', reward: 1 });
    const rssGrowthMb = (process.memoryUsage().rss - rssBefore) / 1024 / 1024;
    expect(rssGrowthMb).toBeLessThan(200);

    const episodeDir = path.join(env.dataDir, 'evidence', result!.episodeId);
    const attemptDir = path.join(episodeDir, 'attempt-1');
    // Only the episode's own folder was written under evidence/.
    expect(await readdir(path.join(env.dataDir, 'evidence'))).toEqual([result!.episodeId]);
    expect(await readdir(episodeDir)).toEqual(['attempt-1']);

    const snapshot = path.join(attemptDir, 'workspace');
    expect((await readdir(snapshot)).sort()).toEqual(['a', 'state.txt']);
    expect(await readFile(path.join(snapshot, 'a', '..b', 'c.txt'), 'utf8')).toBe('odd\n');
    await expect(lstat(path.join(snapshot, 'rootlink'))).rejects.toMatchObject({ code: 'ENOENT' });

    const evidence = JSON.parse(await readFile(path.join(attemptDir, 'evidence.json'), 'utf8')) as {
      agent: { stdout: { totalBytes: number; truncated: boolean; capBytes: number } };
      workspace: { added: string[]; modified: string[]; extraction: { skipped: { path: string; reason: string }[] } };
    };
    expect(evidence.agent.stdout).toEqual({ totalBytes: 1_000_000_000, truncated: true, capBytes: OUTPUT_CAP });
    expect(evidence.workspace.modified).toEqual(['state.txt']);
    expect(evidence.workspace.added).toEqual(['a/..b/c.txt']);
    expect(evidence.workspace.extraction.skipped.map((s) => s.path).sort()).toEqual(['rootlink', 'uplink']);
    expect((await stat(path.join(attemptDir, 'agent.stdout.txt'))).size).toBeLessThan(OUTPUT_CAP + 100);
    expect(await readFile(path.join(attemptDir, 'workspace.diff'), 'utf8')).toContain('-broken\n+fixed');
    await waitForNoContainers(plan.batchId);
  });
});

describe('the workspace snapshot', () => {
  let env: FleetEnv;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    worker = await startEnvWorker(env, 'snapshot-w', { concurrency: 2, callTimeoutMs: 30_000 });
  });
  afterAll(async () => {
    await worker?.close();
    await env?.close();
  });

  const readEvidence = async (episodeId: string) => {
    const attemptDir = path.join(env.dataDir, 'evidence', episodeId, 'attempt-1');
    const evidence = JSON.parse(await readFile(path.join(attemptDir, 'evidence.json'), 'utf8')) as {
      workspace: { takenAt: string; added: string[]; modified: string[] };
    };
    return { attemptDir, evidence };
  };

  it('is the workspace the agent left, taken with the sweep: what the verifier writes is not in it', async () => {
    const task = (id: string) => ({
      yaml: `id: ${id}\ninstruction: x\nverify:\n  command: grep -qx fixed state.txt && echo graded > graded.txt && echo verifier >> state.txt\n  timeoutSec: 10\ndeadlineSec: 300\n`,
      files: { 'workspace/state.txt': 'broken\n', 'tests/.keep': '' },
    });
    // In "unreadable" the sandbox user cannot read a file it made, so the sweep's copy fails: the
    // engine's copy at close has it (and what the verifier wrote).
    const agent = 'echo fixed > state.txt; echo note > notes.txt; if [ "$TASK_ID" = unreadable ]; then echo secret > hidden.txt; chmod 000 hidden.txt; fi';
    const file = await writeBatch(`tasks: [tasks]\nagent: { kind: command, command: ${JSON.stringify(agent)} }\n`, { plain: task('plain'), unreadable: task('unreadable') });
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, 2, 180_000);
    const byTask = new Map(results.map((r) => [r.taskId, r]));
    for (const r of results) expect(r).toMatchObject({ status: 'passed', reward: 1 });

    const plain = await readEvidence(byTask.get('plain')!.episodeId);
    expect(plain.evidence.workspace).toMatchObject({ takenAt: 'agent-stopped', added: ['notes.txt'], modified: ['state.txt'] });
    expect(await readFile(path.join(plain.attemptDir, 'workspace', 'state.txt'), 'utf8')).toBe('fixed\n');
    await expect(lstat(path.join(plain.attemptDir, 'workspace', 'graded.txt'))).rejects.toMatchObject({ code: 'ENOENT' });

    const unreadable = await readEvidence(byTask.get('unreadable')!.episodeId);
    expect(unreadable.evidence.workspace.takenAt).toBe('close');
    expect(unreadable.evidence.workspace.added.sort()).toEqual(['graded.txt', 'hidden.txt', 'notes.txt']);
    expect(await readFile(path.join(unreadable.attemptDir, 'workspace', 'hidden.txt'), 'utf8')).toBe('secret\n');
    await waitForNoContainers(plan.batchId);
  });
});
