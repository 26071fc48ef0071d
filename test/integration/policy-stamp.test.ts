// The policy stamp of one model proxy, on a real Redis and the scripted policy server: no stamp while
// no version was set, the version current at each call's start, the episode's versions recorded, a
// call past maxStaleness refused before it goes upstream, and, while Redis does not answer (stopped
// with SIGSTOP), calls answered on time, stamped from the worker's last read and marked so.
import { mkdtemp, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { PolicyStamper, episodeVersions, setPolicyVersion, type PolicyStamp } from '../../src/model/policy-versions.ts';
import { silentLog } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS, chat, conversation } from '../helpers/model.ts';

describe('policy stamp at the model proxy', () => {
  let stub: ModelStub;
  let redis: PrivateRedis;
  let client: Redis;
  let dataDir: string;
  const prefix = `stamp${process.pid}`;

  beforeAll(async () => {
    stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, log: silentLog });
    redis = await startPrivateRedis();
    client = new Redis(redis.url, { maxRetriesPerRequest: null });
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-stamp-'));
  });
  afterAll(async () => {
    redis?.process.kill('SIGCONT');
    await stub?.close();
    client?.disconnect();
    await redis?.stop();
  });

  it('stamps each call with the version at its start, refuses one past maxStaleness, and falls back to the last read while Redis hangs', async () => {
    const stamper = new PolicyStamper(client, prefix, silentLog, { timeoutMs: 300 });
    const episodeId = 'stamp-test.fix-greeting.0';
    const evidenceFile = path.join(dataDir, MODEL_CALLS_FILE);
    const stale: PolicyStamp[] = [];
    const proxy = await startModelProxy({
      socketPath: modelSocketPath(dataDir, 'stamp'), upstreamBaseUrl: stub.baseUrl!, budget: { maxCalls: 20, maxTokens: 100_000 },
      evidenceFile, episodeId, taskId: 'fix-greeting', log: silentLog, retry: { retries: 0 },
      policy: stamper.forEpisode('default', episodeId, 1), onStale: (s) => stale.push(s),
    });
    const target = { socketPath: proxy.socketPath };
    const body = { messages: conversation('Solve the task.') };
    const records = async () => (await readFile(evidenceFile, 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
    try {
      // No version set: the call goes through unstamped.
      expect((await chat(target, body)).status).toBe(200);
      await setPolicyVersion(client, prefix, 'default', 5);
      expect((await chat(target, body)).status).toBe(200);
      await setPolicyVersion(client, prefix, 'default', 6);
      expect((await chat(target, body)).status).toBe(200);
      expect(await episodeVersions(client, prefix, episodeId, 'default')).toEqual({ endpoint: 'default', first: 5, last: 6, seen: [5, 6] });
      // 7 is two past the first (5): refused before going upstream, and the episode is told.
      await setPolicyVersion(client, prefix, 'default', 7);
      const upstreamBefore = stub.calls().reduce((n, c) => n + c.count, 0);
      const refused = await chat(target, body);
      expect(refused.status).toBe(409);
      expect(refused.json).toMatchObject({ error: { type: 'policy_stale', policyVersion: 7, firstVersion: 5 } });
      expect(stale).toMatchObject([{ version: 7, first: 5, stale: true, source: 'redis' }]);
      expect(stub.calls().reduce((n, c) => n + c.count, 0)).toBe(upstreamBefore);
      // Not recorded as seen: the call did not run.
      expect((await episodeVersions(client, prefix, episodeId, 'default'))?.seen).toEqual([5, 6]);

      // Redis stops answering: the next call waits the stamp timeout, then is stamped from the last read (7).
      redis.process.kill('SIGSTOP');
      const t = performance.now();
      const cached = await chat(target, body);
      const waited = performance.now() - t;
      redis.process.kill('SIGCONT');
      expect(waited).toBeGreaterThanOrEqual(290);
      // From the cache the staleness is checked against this attempt's first read (5): 7 is too stale still.
      expect(cached.status).toBe(409);
      expect(stale.at(-1)).toMatchObject({ version: 7, source: 'cache' });

      const lines = await records();
      expect(lines.map((r) => [r.status, r.policyVersion ?? null, r.policyVersionSource ?? null])).toEqual([
        [200, null, null], [200, 5, null], [200, 6, null], [409, 7, null], [409, 7, 'cache'],
      ]);
    } finally {
      await proxy.close();
    }
  });

  it('while Redis hangs, a fresh episode is stamped from the cache and answered', async () => {
    const stamper = new PolicyStamper(client, prefix, silentLog, { timeoutMs: 300 });
    const episodeId = 'stamp-test.fix-greeting.1';
    const evidenceFile = path.join(dataDir, 'fresh', MODEL_CALLS_FILE);
    const proxy = await startModelProxy({
      socketPath: modelSocketPath(dataDir, 'fresh'), upstreamBaseUrl: stub.baseUrl!, budget: { maxCalls: 20, maxTokens: 100_000 },
      evidenceFile, episodeId, taskId: 'fix-greeting', log: silentLog, retry: { retries: 0 }, policy: stamper.forEpisode('default', episodeId, 1),
    });
    try {
      await setPolicyVersion(client, prefix, 'default', 9);
      expect((await chat({ socketPath: proxy.socketPath }, { messages: conversation('Solve the task.') })).status).toBe(200);
      redis.process.kill('SIGSTOP');
      const answer = await chat({ socketPath: proxy.socketPath }, { messages: conversation('Solve the task.') });
      redis.process.kill('SIGCONT');
      expect(answer.status).toBe(200);
      const lines = (await readFile(evidenceFile, 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
      expect(lines.map((r) => [r.policyVersion, r.policyVersionSource ?? null])).toEqual([[9, null], [9, 'cache']]);
    } finally {
      await proxy.close();
    }
  });
});
