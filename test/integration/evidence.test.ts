// Evidence from a hostile sandbox: links and odd names in its workspace cannot make extraction write
// outside the episode's folder, and 1 GB of output costs neither the disk nor the worker's memory.
import { lstat, readFile, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/cli/worker-process.ts';
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
