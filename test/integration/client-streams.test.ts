// Several result streams on one client (as the API serves several trainers): a stream waiting on a
// quiet batch must not hold back another batch's results. Found by the stream bench: every iterator
// shared one connection, so a second SSE client on an idle batch delayed deliveries by up to its block
// time (p99 1 s). Real Redis, results recorded as a worker records them; no Docker needed.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import { FleetClient } from '../../src/client/fleet-client.ts';
import { startFleetEnv, waitFor, type FleetEnv } from '../helpers/fleet.ts';

function result(batchId: string, taskId: string, sample: number): EpisodeResult {
  const now = new Date().toISOString();
  return {
    episodeId: `${batchId}.${taskId}.${sample}`, batchId, taskId, sample,
    status: 'passed', reward: 1, attempts: 1, workerId: 'test',
    timings: { setupMs: 1, agentMs: 1, verifyMs: 1, closeMs: 1, totalMs: 4 },
    provenance: { taskDigest: '0'.repeat(64), image: 'busybox:1.36', agent: { kind: 'command', command: 'true' } },
    agent: { exitCode: 0, timedOut: false, durationMs: 1 },
    verifier: { exitCode: 0, timedOut: false, durationMs: 1 },
    startedAt: now, endedAt: now,
  };
}

describe('TypeScript client: concurrent result streams', () => {
  let env: FleetEnv;
  let client: FleetClient;

  beforeAll(async () => {
    env = await startFleetEnv();
    client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
  });
  afterAll(async () => {
    await client?.close();
    await env?.close();
  });

  it('delivers a busy batch\'s results while another stream blocks on a quiet batch', async () => {
    for (const batchId of ['quiet-000000000000', 'busy-000000000000']) {
      await env.results.putManifest({ batchId, name: batchId.split('-')[0]!, createdAt: new Date().toISOString(), episodeIds: [`${batchId}.t.0`, `${batchId}.t.1`] });
    }
    const quietStop = new AbortController();
    // The quiet batch's stream blocks for 60 s at a time: with one shared connection, the busy stream's
    // reads would queue behind that block and this test would time out.
    const quiet = (async () => {
      for await (const _ of client.results('quiet-000000000000', { signal: quietStop.signal, blockMs: 60_000 })) { /* nothing ends */ }
    })().catch(() => undefined);
    const busy = client.results('busy-000000000000', { blockMs: 60_000 });
    // The quiet stream's blocking read is in place first.
    await waitFor('the quiet stream to block', async () => String(await env.client.client('LIST')).includes('cmd=xread'), 10_000, 20);
    const first = busy.next();
    await env.results.record(result('busy-000000000000', 't', 0));
    expect((await first).value).toMatchObject({ kind: 'result', result: { episodeId: 'busy-000000000000.t.0' } });
    await env.results.record(result('busy-000000000000', 't', 1));
    expect((await busy.next()).value).toMatchObject({ kind: 'result', result: { episodeId: 'busy-000000000000.t.1' } });
    expect((await busy.next()).value).toMatchObject({ kind: 'group', taskId: 't', episodeIds: ['busy-000000000000.t.0', 'busy-000000000000.t.1'] });
    expect((await busy.next()).done).toBe(true);
    quietStop.abort();
    await quiet;
  }, 20_000);
});
