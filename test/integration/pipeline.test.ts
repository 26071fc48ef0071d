// The whole pipeline on real Redis and real Docker: the example batch x 2 samples through 2 worker
// processes; every episode runs exactly once, rewards are right, nothing is left behind.
import path from 'node:path';
import type { Readable } from 'node:stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LABEL } from '../../src/sandbox/labels.ts';
import {
  EXAMPLES, docker, runCli, waitFor, spawnWorker, startFleetEnv, waitForNoContainers, waitForResults,
  type FleetEnv, type WorkerProcess,
} from '../helpers/fleet.ts';

const SOLVABLE = ['fix-greeting', 'js-median', 'set-port', 'sum-column'];
const EPISODES = (SOLVABLE.length + 1) * 2;
const UNSOLVABLE = 'reverse-lines';

describe('episode pipeline', () => {
  let env: FleetEnv;
  let workers: WorkerProcess[] = [];
  let batchId: string;
  const creates = new Map<string, number>();
  let events: Readable;

  beforeAll(async () => {
    env = await startFleetEnv();
    // Count container creations per episode from the engine's own event stream.
    events = (await docker.getEvents({ filters: { type: ['container'], event: ['create'], label: [`${LABEL.managed}=1`] } })) as Readable;
    events.on('data', (chunk: Buffer) => {
      for (const line of chunk.toString().split('\n').filter(Boolean)) {
        const ev = JSON.parse(line) as { Actor: { Attributes: Record<string, string> } };
        const id = ev.Actor.Attributes[LABEL.episode];
        if (id !== undefined) creates.set(id, (creates.get(id) ?? 0) + 1);
      }
    });
    workers = [spawnWorker(env.env, 'pipeline-w1'), spawnWorker(env.env, 'pipeline-w2')];
  });

  afterAll(async () => {
    events?.destroy();
    await Promise.all(workers.map((w) => w.stop()));
    await env?.close();
  });

  it('runs every episode exactly once with the right reward and leaves no container', async () => {
    const run = await runCli(['enqueue', path.join(EXAMPLES, 'oracle-batch.yaml'), '--json'], env.env);
    expect(run.stderr).toBe('');
    expect(run.code).toBe(0);
    const out = JSON.parse(run.stdout) as { batchId: string; episodes: number; added: boolean };
    batchId = out.batchId;
    expect(out).toMatchObject({ episodes: EPISODES, added: true });

    const results = await waitForResults(env, batchId, EPISODES);
    expect(results).toHaveLength(EPISODES);
    expect(new Set(results.map((r) => r.episodeId)).size).toBe(EPISODES);
    for (const r of results) {
      expect(r.attempts, r.episodeId).toBe(1);
      expect(r.provenance.imageId).toMatch(/^sha256:/);
      expect(r.provenance.taskDigest).toMatch(/^[0-9a-f]{64}$/);
      if (r.taskId === UNSOLVABLE) {
        expect([r.status, r.reward]).toEqual(['failed', 0]);
      } else {
        expect(SOLVABLE).toContain(r.taskId);
        expect([r.status, r.reward], `${r.episodeId}: ${JSON.stringify(r.error)}`).toEqual(['passed', 1]);
      }
    }
    // Both worker processes took part, and each episode had exactly one container.
    expect(new Set(results.map((r) => r.workerId))).toEqual(new Set(['pipeline-w1', 'pipeline-w2']));
    await waitForNoContainers(batchId);
    expect([...creates.entries()].filter(([id]) => id.startsWith(batchId)).map(([, n]) => n)).toEqual(Array(EPISODES).fill(1));

    // The job's return value is the same result.
    const job = await env.episodes.getJob(results[0]!.episodeId);
    expect(job?.returnvalue).toEqual(results[0]);

    // The batch parent ran once its last episode ended, and stored the summary; status reads the same.
    const expected = { total: EPISODES, done: EPISODES, finished: true, byStatus: { passed: EPISODES - 2, failed: 2 }, meanReward: 0.8, passAt: { 1: 0.8, 2: 0.8 } };
    const stored = await waitFor('the batch summary', () => env.results.storedSummary(batchId), 30_000, 200);
    expect(stored).toMatchObject(expected);
    expect(stored.phases.totalMs.n).toBe(EPISODES);
    expect((await env.flows.getFlow({ id: batchId, queueName: 'batches', prefix: env.prefix }))?.job.returnvalue).toEqual(stored);
    const status = await runCli(['status', batchId, '--json'], env.env);
    expect(JSON.parse(status.stdout)).toMatchObject(expected);
    const lines = (await runCli(['results', batchId, '--format', 'jsonl'], env.env)).stdout.trim().split('\n');
    expect(lines.map((l) => (JSON.parse(l) as { episodeId: string }).episodeId)).toEqual(results.map((r) => r.episodeId));
    const csv = (await runCli(['results', batchId, '--format', 'csv'], env.env)).stdout.trim().split('\n');
    expect(csv[0]).toMatch(/^episode_id,batch_id,task_id,sample,status,error_kind,error_code,reward,/);
    expect(csv.slice(1).map((row) => row.split(',').slice(0, 8).join(','))).toEqual(
      results.map((r) => [r.episodeId, batchId, r.taskId, r.sample, r.status, '', '', r.reward].join(',')));
  });

  it('adds nothing when the same batch is enqueued again', async () => {
    const before = await env.episodes.getJobCounts();
    const run = await runCli(['enqueue', path.join(EXAMPLES, 'oracle-batch.yaml')], env.env);
    expect(run.code).toBe(0);
    expect(run.stdout.trim()).toBe(batchId);
    expect(run.stderr).toBe(`batch ${batchId} was enqueued before; nothing added\n`);
    expect(await env.episodes.getJobCounts()).toEqual(before);
    expect(await env.episodes.count()).toBe(0);
    expect((await env.results.results(batchId)).length).toBe(EPISODES);
  });

  it('stops worker processes cleanly, releasing every Redis connection', async () => {
    const codes = await Promise.all(workers.map((w) => w.stop()));
    expect(codes).toEqual([0, 0]);
    // Only the test's own connection (and the queues sharing it) remains.
    const clients = (await env.client.client('LIST')) as string;
    const names = clients.trim().split('\n').map((l) => /name=(\S*)/.exec(l)?.[1] ?? '');
    expect(names.filter((n) => n.includes('pipeline-w'))).toEqual([]);
    expect(clients.trim().split('\n')).toHaveLength(1);
  });
});
