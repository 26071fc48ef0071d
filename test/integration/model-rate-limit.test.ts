// The fleet against a model endpoint's rate limit: 3 worker processes (the compiled CLI) at
// concurrency 4 run LLM episodes through their proxies against the scripted model stub limited to N
// requests a minute (429 + Retry-After beyond it); every proxy asks the fleet-wide limiter, set to the
// same N, before each upstream attempt. The endpoint is kept within its limit (a 429 at most from the
// opening burst), no episode fails for it, and the endpoint's numbers reach /metrics.
// (bench/model-rate-limit-fleet.ts measures the throughput against N.)
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { readEndpointLimitMetrics } from '../../src/model/fleet-limits.ts';
import { EXAMPLES, enqueueFile, silentLog, spawnWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const RPM = 300;

describe('fleet-wide model rate limit', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  const workers: WorkerProcess[] = [];

  beforeAll(async () => {
    env = await startFleetEnv();
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0 }, rateLimitRpm: RPM, log: silentLog });
    for (let i = 0; i < 3; i++) {
      workers.push(spawnWorker({ ...env.env, MODEL_BASE_URL: stub.baseUrl!, MODEL_REQUESTS_PER_MINUTE: String(RPM) }, `rl-${i}`, 4));
    }
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.stop()));
    await stub?.close();
    await env?.close();
  });

  it('keeps 12 concurrent LLM episodes within the endpoint limit, and none fails for it', async () => {
    const file = await writeBatch(`name: rate-limited\ntasks: [${JSON.stringify(path.join(EXAMPLES, 'tasks'))}]\nsamples: 3\nagent: { kind: llm, maxTurns: 12 }\n`, {});
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 240_000);
    for (const r of results) {
      expect(r.status === 'passed' || (r.taskId === 'reverse-lines' && r.status === 'failed'), `${r.episodeId}: ${r.status} ${JSON.stringify(r.error)}`).toBe(true);
    }
    const stats = (await (await fetch(`${stub.baseUrl!.replace(/\/v1$/, '')}/_stub/stats`)).json()) as { answered: number; rateLimited: number };
    // ~50 calls at 5 a second: the demand of 12 agents is well above it, so the limiter, not the
    // agents, set the pace; without it the stub answered 429 to 48 of 99 requests in a trial run.
    expect(stats.answered).toBeGreaterThanOrEqual(results.length * 3);
    expect(stats.rateLimited, JSON.stringify(stats)).toBeLessThanOrEqual(2);
    const [metrics] = await readEndpointLimitMetrics(env.client, env.prefix);
    expect(metrics).toMatchObject({ host: new URL(stub.baseUrl!).host, inFlight: 0, rateLimited: stats.rateLimited });
    expect(metrics!.tokensLastMinute).toBeGreaterThan(0);
    await waitForNoContainers(plan.batchId);
    expect(workers.map((w) => w.child.exitCode)).toEqual([null, null, null]);
  });
});
