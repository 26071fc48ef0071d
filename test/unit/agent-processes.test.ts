// The batch's agentProcesses (Harbor tasks graded in the agent's container): validated and named in
// errors, part of the batch id when set (a batch without it keeps its id), carried by every job.
import { cp, mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { EpisodeJob } from '../../src/episode/episode-job.ts';
import { planBatch } from '../../src/producer/enqueue-batch.ts';
import { loadBatch } from '../../src/tasks/load-task.ts';

const TASK = path.join(import.meta.dirname, '../../test/fixtures/harbor/hello-file');

async function batchFile(extra: string): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-agent-processes-'));
  await cp(TASK, path.join(dir, 'hello-file'), { recursive: true });
  const file = path.join(dir, 'batch.yaml');
  await writeFile(file, `name: procs\ntasks: [hello-file]\nsamples: 2\nagent: { kind: oracle }\n${extra}`);
  return file;
}

describe('agentProcesses', () => {
  it('refuses a value that is neither keep nor stop, naming the field and the value', async () => {
    const err = await loadBatch(await batchFile('agentProcesses: kill\n')).then(() => undefined, (e: Error) => e);
    expect(err?.message).toMatch(/agentProcesses/);
    expect(err?.message).toMatch(/keep/);
    expect(err?.message).toContain('kill');
  });

  it('is part of the batch id when set and carried by every job; unset, the jobs carry none (keep)', async () => {
    const none = await planBatch(await loadBatch(await batchFile('')));
    const stop = await planBatch(await loadBatch(await batchFile('agentProcesses: stop\n')));
    const keep = await planBatch(await loadBatch(await batchFile('agentProcesses: keep\n')));
    expect(new Set([none.batchId, stop.batchId, keep.batchId]).size).toBe(3);
    expect(none.jobs.every((j) => j.agentProcesses === undefined)).toBe(true);
    expect(stop.jobs.map((j) => j.agentProcesses)).toEqual(['stop', 'stop']);
    expect(EpisodeJob.safeParse({ ...stop.jobs[0], agentProcesses: 'pause' }).success).toBe(false);
  });
});
