// Several model endpoints in one fleet. Two workers carry the same table of two endpoints, `alpha` and
// `beta`, each a scripted model stub with its own key, script (beta's never solves) and fleet-wide
// concurrency limit (1 and 2), behind a recorder written here that sees every request reaching it.
// Two batches enqueued together, one per endpoint: each episode's calls reach only its batch's
// endpoint, each endpoint's limit holds while the other is saturated, and neither key reaches the
// other endpoint or any sandbox. A batch's sampling is filled in (the agent's value kept) or, with
// `enforce`, overwrites the agent's; the sandbox is told the model's name; a command agent's usage
// reaches its result and the summary. Enqueue refuses an endpoint no live worker has, and a worker
// without the batch's endpoint fails the episode as unknown_endpoint before making a sandbox.
import { once } from 'node:events';
import { readFile, readdir } from 'node:fs/promises';
import http from 'node:http';
import type net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SANDBOX_API_KEY } from '../../src/agent/command-agent.ts';
import type { ModelEndpoint } from '../../src/config/model-endpoints.ts';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { MODEL_CALLS_FILE } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { EPISODE_HEADER } from '../../src/model/chat-protocol.ts';
import { formatSummary } from '../../src/results/batch-summary.ts';
import { RUNTIME_MOUNT_PATH } from '../../src/runtime/runtime-inputs.ts';
import { readHostFacts } from '../../src/worker/host-facts.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { FleetClient, type BatchEvent } from '../../src/client/fleet-client.ts';
import { EXAMPLES, enqueueFile, fleetContainers, runCli, silentLog, spawnWorker, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv, type WorkerProcess } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const KEY_ALPHA = `sk-alpha-${process.pid}-only-for-alpha`;
const KEY_BETA = `sk-beta-${process.pid}-only-for-beta`;
const TASKS = path.join(EXAMPLES, 'tasks');
const FIX_GREETING = path.join(TASKS, 'fix-greeting');

interface Seen {
  episodeId: string;
  authorization: string | undefined;
  body: Record<string, unknown>;
}

/** In front of a stub: records each chat request (its episode, key, body) and how many are in flight at once. */
async function startRecorder(name: string, target: string, peers: Map<string, { inFlight(): number }>) {
  const seen: Seen[] = [];
  const up = new URL(target);
  let inFlight = 0;
  let maxInFlight = 0;
  /** Moments this endpoint was at `atLeast` in flight while each peer was too: peer name -> peers' in-flight seen. */
  const overlaps: Array<{ here: number; peers: Record<string, number> }> = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks);
      const chat = (req.url ?? '').endsWith('/chat/completions');
      if (chat) {
        seen.push({ episodeId: String(req.headers[EPISODE_HEADER] ?? ''), authorization: req.headers.authorization, body: JSON.parse(raw.toString('utf8')) as Record<string, unknown> });
        inFlight += 1;
        maxInFlight = Math.max(maxInFlight, inFlight);
        overlaps.push({ here: inFlight, peers: Object.fromEntries([...peers].filter(([n]) => n !== name).map(([n, p]) => [n, p.inFlight()])) });
      }
      let done = false;
      const end = () => {
        if (chat && !done) inFlight -= 1;
        done = true;
      };
      const out = http.request({ host: up.hostname, port: up.port, method: req.method, path: req.url, headers: req.headers, agent: false }, (upRes) => {
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        upRes.on('data', (c: Buffer) => res.write(c));
        upRes.on('end', () => {
          end();
          res.end();
        });
        upRes.on('error', () => {
          end();
          res.socket?.destroy();
        });
      });
      out.on('error', () => {
        end();
        res.socket?.destroy();
      });
      out.end(raw);
    });
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const recorder = {
    baseUrl: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/v1`,
    seen,
    overlaps,
    inFlight: () => inFlight,
    maxInFlight: () => maxInFlight,
    close: () => new Promise((r) => server.close(r)),
  };
  peers.set(name, recorder);
  return recorder;
}

/**
 * The command agent of the sampling test (our own, run with the runtime's node): reports the model
 * variables it was given, makes two calls (one naming its own model and temperature 1.3, one naming
 * neither), and dumps its environment and every process's environment and command line for the test
 * to search for the real keys.
 */
const SAMPLING_AGENT = `
import { readFileSync, readdirSync } from 'node:fs';
const base = process.env.OPENAI_BASE_URL;
const messages = [{ role: 'user', content: process.env.TASK_INSTRUCTION }];
async function call(body) {
  const res = await fetch(base + '/chat/completions', { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer ' + process.env.OPENAI_API_KEY }, body: JSON.stringify(body) });
  const json = await res.json();
  return { status: res.status, usage: json.usage };
}
const first = await call({ model: 'agent-own-model', messages, temperature: 1.3 });
const second = await call({ messages });
let seen = JSON.stringify(process.env);
for (const pid of readdirSync('/proc').filter((p) => /^[0-9]+$/.test(p))) {
  for (const f of ['environ', 'cmdline']) {
    try { seen += readFileSync('/proc/' + pid + '/' + f, 'latin1'); } catch {}
  }
}
console.log('REPORT ' + JSON.stringify({ model: process.env.OPENAI_MODEL ?? null, modelName: process.env.OPENAI_MODEL_NAME ?? null, first, second }));
console.log('SEEN ' + Buffer.from(seen).toString('base64'));
`;

describe('named model endpoints: two endpoints, two batches, one fleet', () => {
  let env: FleetEnv;
  let stubAlpha: ModelStub;
  let stubBeta: ModelStub;
  const peers = new Map<string, { inFlight(): number }>();
  let alpha: Awaited<ReturnType<typeof startRecorder>>;
  let beta: Awaited<ReturnType<typeof startRecorder>>;
  const workers: WorkerHandle[] = [];
  let table: ModelEndpoint[];

  const models = (endpoints: ModelEndpoint[]) => ({ endpoints, maxCalls: 30, maxTokens: 500_000, requestTimeoutMs: 60_000, upstreamRetries: 1 });

  beforeAll(async () => {
    env = await startFleetEnv();
    // Slow answers: calls of several episodes overlap, so each endpoint's limit is what holds them.
    stubAlpha = await startModelStub({ tasksDir: TASKS, listen: { port: 0 }, requireKey: KEY_ALPHA, delayMs: 300, log: silentLog });
    // A different script: beta's episodes all finish without solving.
    stubBeta = await startModelStub({ tasksDir: TASKS, listen: { port: 0 }, requireKey: KEY_BETA, delayMs: 300, wrongFraction: 1, log: silentLog });
    alpha = await startRecorder('alpha', stubAlpha.baseUrl!, peers);
    beta = await startRecorder('beta', stubBeta.baseUrl!, peers);
    table = [
      { name: 'alpha', baseUrl: alpha.baseUrl, apiKey: KEY_ALPHA, model: 'alpha-served', limits: { maxConcurrent: 1 } },
      { name: 'beta', baseUrl: beta.baseUrl, apiKey: KEY_BETA, limits: { maxConcurrent: 2 } },
    ];
    for (const id of ['ep-w1', 'ep-w2']) {
      workers.push(await startEnvWorker(env, id, { concurrency: 4, callTimeoutMs: 30_000, outputCapBytes: 256 * 1024, model: models(table) }));
    }
    // Both report their endpoints before anything is enqueued.
    await waitFor('both workers to report their endpoints', async () => {
      const facts = await readHostFacts(env.client, env.prefix);
      return facts.length === 2 && facts.every((f) => f.modelEndpoints?.join(',') === 'alpha,beta');
    });
  });
  afterAll(async () => {
    await Promise.all(workers.map((w) => w.close()));
    await alpha?.close();
    await beta?.close();
    await stubAlpha?.close();
    await stubBeta?.close();
    await env?.close();
  });

  const callsOf = async (episodeId: string, attempt = 1): Promise<ModelCallRecord[]> =>
    (await readFile(path.join(env.dataDir, 'evidence', episodeId, `attempt-${attempt}`, MODEL_CALLS_FILE), 'utf8')).trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as ModelCallRecord);

  /** Every file the fleet wrote under its data folder (results, evidence, summaries), read as text. */
  async function everythingWritten(): Promise<string> {
    const parts: string[] = [];
    const walk = async (dir: string) => {
      for (const entry of await readdir(dir, { withFileTypes: true }).catch(() => [])) {
        const full = path.join(dir, entry.name);
        if (entry.isDirectory()) {
          if (entry.name !== 'runtime-src') await walk(full);
        } else if (entry.isFile()) parts.push(await readFile(full, 'latin1').catch(() => ''));
      }
    };
    await walk(env.dataDir);
    return parts.join('\n');
  }

  it('refuses at enqueue a batch whose endpoint no live worker has, naming the field and value', async () => {
    const file = await writeBatch(`name: ep-gamma\ntasks: [${JSON.stringify(FIX_GREETING)}]\nagent: { kind: llm }\nmodel: { endpoint: gamma }\n`, {});
    await expect(enqueueFile(env, file)).rejects.toThrow(/model\.endpoint: no live worker has the endpoint "gamma".*"alpha", "beta" \(got "gamma"\)/);
    expect(await env.results.getManifest('ep-gamma')).toBeUndefined();
  });

  it("sends each batch's calls to its own endpoint only, with its own key, under its own limit", async () => {
    const batch = (name: string, model: string) => writeBatch(
      `name: ${name}\ntasks: [${JSON.stringify(FIX_GREETING)}, ${JSON.stringify(path.join(TASKS, 'sum-column'))}]\nsamples: 2\nagent: { kind: llm, maxTurns: 10 }\nmodel: ${model}\n`,
      {},
    );
    const planA = await enqueueFile(env, await batch('ep-alpha', '{ endpoint: alpha }'));
    const planB = await enqueueFile(env, await batch('ep-beta', '{ endpoint: beta, name: beta-batch-model }'));
    expect(planA.batchId).not.toBe(planB.batchId);
    const [resultsA, resultsB] = await Promise.all([waitForResults(env, planA.batchId, 4, 300_000), waitForResults(env, planB.batchId, 4, 300_000)]);

    // alpha's script solves, beta's never does: the rewards say which endpoint answered.
    for (const r of resultsA) expect([r.status, r.reward, r.model], `${r.episodeId} ${JSON.stringify(r.error)}`).toEqual(['passed', 1, { endpoint: 'alpha', name: 'alpha-served' }]);
    for (const r of resultsB) expect([r.status, r.reward, r.model], `${r.episodeId} ${JSON.stringify(r.error)}`).toEqual(['failed', 0, { endpoint: 'beta', name: 'beta-batch-model' }]);

    // Counted at each endpoint: every call there is of its own batch, with its own key, and as many
    // as the episodes' evidence records answered.
    const idsA = new Set(planA.jobs.map((j) => j.episodeId));
    const idsB = new Set(planB.jobs.map((j) => j.episodeId));
    expect(alpha.seen.length).toBeGreaterThan(0);
    expect(beta.seen.length).toBeGreaterThan(0);
    expect(alpha.seen.filter((s) => !idsA.has(s.episodeId))).toEqual([]);
    expect(beta.seen.filter((s) => !idsB.has(s.episodeId))).toEqual([]);
    expect(new Set(alpha.seen.map((s) => s.authorization))).toEqual(new Set([`Bearer ${KEY_ALPHA}`]));
    expect(new Set(beta.seen.map((s) => s.authorization))).toEqual(new Set([`Bearer ${KEY_BETA}`]));
    // The endpoint's model forced on alpha, the batch's name on beta (the llm agent asks for it).
    expect(new Set(alpha.seen.map((s) => s.body.model))).toEqual(new Set(['alpha-served']));
    expect(new Set(beta.seen.map((s) => s.body.model))).toEqual(new Set(['beta-batch-model']));
    const attemptsUpstream = async (ids: Set<string>) => {
      let n = 0;
      let waited = 0;
      for (const id of ids) {
        for (const c of await callsOf(id)) {
          n += c.attempts?.length ?? 0;
          waited += (c.attempts ?? []).filter((a) => (a.waitedMs ?? 0) > 0).length;
        }
      }
      return { n, waited };
    };
    const upA = await attemptsUpstream(idsA);
    const upB = await attemptsUpstream(idsB);
    expect(upA.n).toBe(alpha.seen.length);
    expect(upB.n).toBe(beta.seen.length);

    // Each limit held: never more than 1 call at alpha, 2 at beta; both were reached, and calls
    // waited for a turn at each (their demand was above their limit) ...
    expect(alpha.maxInFlight()).toBe(1);
    expect(beta.maxInFlight()).toBe(2);
    expect(upA.waited).toBeGreaterThan(0);
    expect(upB.waited).toBeGreaterThan(0);
    // ... and one's limit did not hold the other: beta ran its 2 while alpha ran its 1.
    expect(beta.overlaps.some((o) => o.here === 2 && o.peers.alpha === 1) || alpha.overlaps.some((o) => o.here === 1 && o.peers.beta === 2)).toBe(true);

    // The summary (status, status --json) and the usage of every episode.
    const summaryA = (await env.results.summary(planA.batchId))!;
    const summaryB = (await env.results.summary(planB.batchId))!;
    expect(summaryA.model).toEqual({ endpoint: 'alpha' });
    expect(summaryB.model).toEqual({ endpoint: 'beta', name: 'beta-batch-model' });
    expect(formatSummary(summaryB)).toContain('model endpoint beta, model beta-batch-model');
    for (const r of [...resultsA, ...resultsB]) expect(r.usage!.totalTokens).toBeGreaterThan(0);
    expect(summaryA.tokens.total).toBe(resultsA.reduce((s, r) => s + r.usage!.totalTokens, 0));

    // Neither key in anything the fleet wrote down, nor in Redis.
    const written = await everythingWritten();
    expect(written).not.toContain(KEY_ALPHA);
    expect(written).not.toContain(KEY_BETA);
    const keys = await env.client.keys(`${env.prefix}:*`);
    expect(keys.length).toBeGreaterThan(10);
    const values = await Promise.all(keys.map(async (k) => {
      switch (await env.client.type(k)) {
        case 'string': return (await env.client.get(k)) ?? '';
        case 'hash': return JSON.stringify(await env.client.hgetall(k));
        case 'list': return JSON.stringify(await env.client.lrange(k, 0, -1));
        case 'set': return JSON.stringify(await env.client.smembers(k));
        case 'zset': return JSON.stringify(await env.client.zrange(k, 0, -1));
        case 'stream': return JSON.stringify(await env.client.xrange(k, '-', '+'));
        default: return '';
      }
    }));
    // (the dump reads the jobs: their batch's model options are there)
    expect(values.join('\n')).toContain('beta-batch-model');
    expect(values.join('\n')).not.toContain('only-for-');
    // Each endpoint's limiter state is under its own name.
    expect(keys.some((k) => k.includes(':model-limit') && k.includes('alpha.'))).toBe(true);
    expect(keys.some((k) => k.includes(':model-limit') && k.includes('beta.'))).toBe(true);
    await waitForNoContainers(planA.batchId);
    await waitForNoContainers(planB.batchId);
  });

  /** fix-greeting with the sampling agent in its workspace, on `model`. */
  async function samplingBatch(name: string, model: string): Promise<string> {
    return writeBatch(
      `name: ${name}\ntasks: [tasks/fix-greeting]\nagent: { kind: command, command: ${JSON.stringify(`${RUNTIME_MOUNT_PATH}/bin/node agent.mjs`)} }\nmodel: ${model}\n`,
      {
        'fix-greeting': {
          yaml: await readFile(path.join(FIX_GREETING, 'task.yaml'), 'utf8'),
          files: {
            'workspace/greet.sh': await readFile(path.join(FIX_GREETING, 'workspace/greet.sh'), 'utf8'),
            'workspace/agent.mjs': SAMPLING_AGENT,
            'tests/test.sh': await readFile(path.join(FIX_GREETING, 'tests/test.sh'), 'utf8'),
          },
        },
      },
    );
  }

  it("fills in the batch's sampling and model name, overwrites the agent's with enforce, tells the sandbox the name, and counts a command agent's usage", async () => {
    const before = beta.seen.length;
    const free = await enqueueFile(env, await samplingBatch('ep-free', '{ endpoint: beta, name: beta-free, sampling: { temperature: 0.2, seed: 11 } }'));
    const [freeResult] = await waitForResults(env, free.batchId, 1, 120_000);
    const enforced = await enqueueFile(env, await samplingBatch('ep-enforced', '{ endpoint: beta, name: beta-enforced, sampling: { temperature: 0.2, seed: 11 }, enforce: true }'));
    const [enforcedResult] = await waitForResults(env, enforced.batchId, 1, 120_000);

    const upstream = (episodeId: string) => beta.seen.slice(before).filter((s) => s.episodeId === episodeId).map((s) => s.body);
    // Without enforce: the agent's model and temperature pass; what it omitted is filled in.
    const freeCalls = upstream(freeResult!.episodeId);
    expect(freeCalls.map((b) => [b.model, b.temperature, b.seed])).toEqual([['agent-own-model', 1.3, 11], ['beta-free', 0.2, 11]]);
    // With enforce: the batch's, whatever the agent sent.
    const enforcedCalls = upstream(enforcedResult!.episodeId);
    expect(enforcedCalls.map((b) => [b.model, b.temperature, b.seed])).toEqual([['beta-enforced', 0.2, 11], ['beta-enforced', 0.2, 11]]);
    // The evidence keeps what the agent sent.
    expect((await callsOf(enforcedResult!.episodeId)).map((c) => (c.request as { temperature?: number }).temperature)).toEqual([1.3, undefined]);

    for (const [result, name] of [[freeResult!, 'beta-free'], [enforcedResult!, 'beta-enforced']] as const) {
      const stdout = await readFile(path.join(env.dataDir, 'evidence', result.episodeId, 'attempt-1', 'agent.stdout.txt'), 'utf8');
      const report = JSON.parse(/^REPORT (.*)$/m.exec(stdout)![1]!) as { model: string; modelName: string; first: { status: number; usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } }; second: { status: number; usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } } };
      // The sandbox is told the model's name.
      expect([report.model, report.modelName]).toEqual([name, name]);
      expect([report.first.status, report.second.status]).toEqual([200, 200]);
      // The command agent's usage reaches its result: the sums of what the endpoint reported.
      const sum = (k: 'prompt_tokens' | 'completion_tokens' | 'total_tokens') => report.first.usage[k] + report.second.usage[k];
      expect(result.usage).toEqual({ promptTokens: sum('prompt_tokens'), completionTokens: sum('completion_tokens'), totalTokens: sum('total_tokens') });
      expect(result.model).toEqual({ endpoint: 'beta', name });
      const summary = (await env.results.summary(result.batchId))!;
      expect(summary.tokens).toEqual({ prompt: sum('prompt_tokens'), completion: sum('completion_tokens'), total: sum('total_tokens') });
      // Neither real key in the sandbox: its environment and every process's (the placeholder is there, so the dump works).
      const seen = Buffer.from(/^SEEN (.*)$/m.exec(stdout)![1]!, 'base64').toString('latin1');
      expect(seen).toContain(SANDBOX_API_KEY);
      expect(seen).not.toContain(KEY_ALPHA);
      expect(seen).not.toContain(KEY_BETA);
    }
    // The results stream and `status --json` carry the command agent's usage and the batch's model.
    const client = await FleetClient.connect({ redisUrl: env.redis.url, prefix: env.prefix, dataDir: env.dataDir });
    try {
      const events: BatchEvent[] = [];
      for await (const event of client.results(enforced.batchId, { signal: AbortSignal.timeout(30_000) })) events.push(event);
      const streamed = events.flatMap((e) => (e.kind === 'result' ? [e.result] : []));
      expect(streamed.map((r) => [r.episodeId, r.usage, r.model])).toEqual([[enforcedResult!.episodeId, enforcedResult!.usage, { endpoint: 'beta', name: 'beta-enforced' }]]);
    } finally {
      await client.close();
    }
    const status = await runCli(['status', enforced.batchId, '--json'], env.env);
    expect(status.code, status.stderr).toBe(0);
    const summary = JSON.parse(status.stdout) as { model: unknown; tokens: { total: number } };
    expect(summary.model).toEqual({ endpoint: 'beta', name: 'beta-enforced' });
    expect(summary.tokens.total).toBe(enforcedResult!.usage!.totalTokens);
    expect(summary.tokens.total).toBeGreaterThan(0);
    const text = await runCli(['status', enforced.batchId], env.env);
    expect(text.stdout).toContain('model endpoint beta, model beta-enforced');
    await waitForNoContainers(free.batchId);
    await waitForNoContainers(enforced.batchId);
  });

  it("a worker process without the batch's endpoint fails the episode as unknown_endpoint (kind model), before any sandbox, never with a reward", async () => {
    await Promise.all(workers.splice(0).map((w) => w.close()));
    await waitFor('no live worker facts', async () => (await readHostFacts(env.client, env.prefix)).length === 0);
    // No live worker: enqueue cannot tell, and accepts.
    const plan = await enqueueFile(env, await writeBatch(`name: ep-orphan\ntasks: [${JSON.stringify(FIX_GREETING)}]\nagent: { kind: llm }\nmodel: { endpoint: beta }\n`, {}));
    // The worker command, its table from FLEET_MODEL_ENDPOINTS and its key from the variable keyEnv names.
    const tableEnv = { ...env.env, FLEET_MODEL_ENDPOINTS: JSON.stringify([{ name: 'alpha', baseUrl: alpha.baseUrl, keyEnv: 'EP_ALPHA_KEY', maxConcurrent: 1 }]), FLEET_MODEL_RETRIES: '1', FLEET_INFRA_RETRIES: '0' };
    // Without the key's variable it does not start, naming the variable (never a value).
    const keyless = await runCli(['worker'], { ...tableEnv, FLEET_WORKER_ID: 'ep-keyless' }, 60_000);
    expect(keyless.code).not.toBe(0);
    expect(keyless.stderr).toMatch(/FLEET_MODEL_ENDPOINTS: 0\.keyEnv: the environment variable EP_ALPHA_KEY that holds the key of endpoint "alpha" is not set/);
    const proc: WorkerProcess = spawnWorker({ ...tableEnv, EP_ALPHA_KEY: KEY_ALPHA }, 'ep-w3', 1);
    try {
      await waitFor('the worker to report its endpoints', async () => (await readHostFacts(env.client, env.prefix)).some((f) => f.workerId === 'ep-w3' && f.modelEndpoints?.join(',') === 'alpha'));
      const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
      expect(result).toMatchObject({ status: 'error', reward: null, attempts: 2, error: { kind: 'model', code: 'unknown_endpoint' }, model: { endpoint: 'beta' } });
      expect(result!.error!.message).toMatch(/^model\.endpoint: worker ep-w3 has no endpoint "beta" in its table \(it has "alpha"\)/);
      expect(result!.sandbox).toBeUndefined();
      expect(await fleetContainers('batch', plan.batchId)).toEqual([]);
      // Enqueue now sees the live worker's table, and refuses beta.
      await expect(enqueueFile(env, await writeBatch(`name: ep-orphan2\ntasks: [${JSON.stringify(FIX_GREETING)}]\nagent: { kind: llm }\nmodel: { endpoint: beta }\n`, {})))
        .rejects.toThrow(/model\.endpoint: no live worker has the endpoint "beta" in its table \(FLEET_MODEL_ENDPOINTS\); the 1 live worker\(s\) have "alpha" \(got "beta"\)/);
    } finally {
      expect(await proc.stop()).toBe(0);
    }
    expect(proc.output()).not.toContain(KEY_ALPHA);
  });
});
