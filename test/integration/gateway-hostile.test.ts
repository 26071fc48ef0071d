// The model gateway against a hostile agent, a careless user and a failing machine. Command agents
// (test/fixtures/hostile-agents/*.mjs, run with the runtime's node inside the sandbox) flood the
// forwarder's port, ask for everything but the two allowed routes, kill the forwarder and go for the
// proxy's socket, hunt the real key, spend past the call budget in parallel streams; the upstream
// goes away mid-stream. Between the proxy and the scripted model stub sits a recorder written here:
// it shows exactly what reached the upstream, and can cut or refuse connections.
import { once } from 'node:events';
import { readFile, readdir, writeFile } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { EpisodeResult } from '../../queues/episodes/contract.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import type { ModelSettings } from '../../src/episode/episode-attempt.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { RUNTIME_MOUNT_PATH } from '../../src/runtime/runtime-inputs.ts';
import { EXAMPLES, ROOT, enqueueFile, runCli, silentLog, startEnvWorker, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS } from '../helpers/model.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const API_KEY = `sk-hostile-${process.pid}-real-key-never-inside`;
const TASK = path.join(EXAMPLES, 'tasks', 'fix-greeting');
const AGENTS = path.join(ROOT, 'test/fixtures/hostile-agents');

/** One line of model-calls.jsonl, as far as these tests look. */
interface CallLine {
  path?: string;
  outcome: 'answered' | 'refused' | 'upstream_failed' | 'aborted';
  status?: number;
  error?: { type?: string; message?: string };
  request?: { stream?: boolean };
}

interface Seen {
  method: string;
  url: string;
  headers: http.IncomingHttpHeaders;
}

/**
 * The upstream the worker's proxies call: records every request and relays it to `target` (a model
 * stub). `cutAfterEvents`: destroy both sides of a streamed answer after that many events went
 * through; `refuse`: reset every connection at once.
 */
async function startRecorder(initialTarget: string) {
  const seen: Seen[] = [];
  let target = new URL(initialTarget);
  let mode: { kind: 'pass' } | { kind: 'cutAfterEvents'; events: number } | { kind: 'refuse' } = { kind: 'pass' };
  let cuts = 0;
  const sockets = new Set<net.Socket>();
  const server = http.createServer((req, res) => {
    seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers });
    const up = http.request({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers, agent: false }, (upRes) => {
      res.writeHead(upRes.statusCode ?? 502, upRes.headers);
      let events = 0;
      upRes.on('data', (chunk: Buffer) => {
        res.write(chunk);
        if (mode.kind !== 'cutAfterEvents') return;
        events += chunk.toString('utf8').split('\n\n').length - 1;
        if (events >= mode.events) {
          cuts++;
          up.destroy();
          res.socket?.destroy();
        }
      });
      upRes.on('end', () => res.end());
      upRes.on('error', () => res.socket?.destroy());
    });
    up.on('error', () => res.socket?.destroy());
    req.pipe(up);
  });
  server.on('connection', (s: net.Socket) => {
    if (mode.kind === 'refuse') {
      s.resetAndDestroy();
      return;
    }
    sockets.add(s);
    s.once('close', () => sockets.delete(s));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return {
    baseUrl: `http://127.0.0.1:${(server.address() as net.AddressInfo).port}/v1`,
    seen,
    cuts: () => cuts,
    setTarget(url: string) {
      target = new URL(url);
    },
    /** `refuse` also resets the connections already open (kept alive by the proxies): the upstream is gone. */
    setMode(m: typeof mode) {
      mode = m;
      if (m.kind === 'refuse') for (const s of sockets) s.resetAndDestroy();
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}

/** A TCP server on the host that only counts who connects: nothing in a sandbox may ever reach it. */
async function startCanary() {
  let hits = 0;
  const server = net.createServer((s) => {
    hits++;
    s.destroy();
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { port: (server.address() as net.AddressInfo).port, hits: () => hits, close: () => new Promise((r) => server.close(r)) };
}

describe('model gateway: hostile agents, careless users, failing machines', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let slowStub: ModelStub;
  let recorder: Awaited<ReturnType<typeof startRecorder>>;
  let canary: Awaited<ReturnType<typeof startCanary>>;
  let worker: WorkerHandle | undefined;
  let workers = 0;

  beforeAll(async () => {
    env = await startFleetEnv();
    stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, requireKey: API_KEY, log: silentLog });
    // Slow answers: parallel calls are all in flight at once; streams last long enough to be cut.
    slowStub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, requireKey: API_KEY, delayMs: 500, streamChunkDelayMs: 100, log: silentLog });
    recorder = await startRecorder(stub.baseUrl!);
    canary = await startCanary();
  });
  afterAll(async () => {
    await worker?.close();
    await recorder?.close();
    await canary?.close();
    await stub?.close();
    await slowStub?.close();
    await env?.close();
  });

  /** Replace the worker: one with the given model settings (in front of the recorder), or none at all. */
  async function useWorker(model: Partial<ModelSettings> | null) {
    await worker?.close();
    worker = await startEnvWorker(env, `hostile-w${workers++}`, {
      concurrency: 2,
      callTimeoutMs: 30_000,
      outputCapBytes: 256 * 1024,
      ...(model && { model: { baseUrl: recorder.baseUrl, apiKey: API_KEY, maxCalls: 20, maxTokens: 1_000_000, requestTimeoutMs: 30_000, upstreamRetries: 1, ...model } }),
    });
  }

  interface RunOptions {
    /** `model:` of the command agent, written into the YAML as is. */
    model?: string;
    config?: Record<string, unknown>;
    /** Replaces fix-greeting's deadline and reserves. */
    timing?: string;
  }

  /** fix-greeting run by a command agent that is `agent` (a file of test/fixtures/hostile-agents). */
  async function batchFile(name: string, agent: string, opts: RunOptions = {}): Promise<string> {
    const command = `${RUNTIME_MOUNT_PATH}/bin/node agent.mjs`;
    const taskYaml = await readFile(path.join(TASK, 'task.yaml'), 'utf8');
    return writeBatch(
      `name: ${name}\ntasks: [tasks/fix-greeting]\nsamples: 1\nagent: { kind: command, command: ${JSON.stringify(command)}${opts.model === undefined ? '' : `, model: ${opts.model}`} }\n`,
      {
        'fix-greeting': {
          yaml: opts.timing === undefined ? taskYaml : taskYaml.replace('deadlineSec: 180', opts.timing),
          files: {
            'workspace/greet.sh': await readFile(path.join(TASK, 'workspace/greet.sh'), 'utf8'),
            'workspace/agent.mjs': await readFile(path.join(AGENTS, agent), 'utf8'),
            'workspace/prelude.mjs': await readFile(path.join(AGENTS, 'prelude.mjs'), 'utf8'),
            'workspace/config.json': JSON.stringify(opts.config ?? {}),
            'tests/test.sh': await readFile(path.join(TASK, 'tests/test.sh'), 'utf8'),
          },
        },
      },
    );
  }

  const evidenceDir = (episodeId: string) => path.join(env.dataDir, 'evidence', episodeId, 'attempt-1');
  const evidence = (episodeId: string, file: string) => readFile(path.join(evidenceDir(episodeId), file), 'utf8');
  const callsOf = async (episodeId: string): Promise<CallLine[]> =>
    (await evidence(episodeId, 'model-calls.jsonl')).trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as CallLine);

  interface Run {
    result: EpisodeResult;
    stdout: string;
    report: Record<string, any>;
    /** Wall time from enqueue to the result. */
    ms: number;
  }

  async function run(name: string, agent: string, opts: RunOptions = {}, timeoutMs = 150_000): Promise<Run> {
    const started = Date.now();
    const plan = await enqueueFile(env, await batchFile(name, agent, opts));
    const [result] = await waitForResults(env, plan.batchId, 1, timeoutMs);
    const ms = Date.now() - started;
    const stdout = await evidence(result!.episodeId, 'agent.stdout.txt').catch(() => '');
    const line = /^REPORT (.*)$/m.exec(stdout);
    const report = line ? (JSON.parse(line[1]!) as Record<string, any>) : {};
    // HOSTILE_DUMP=<folder>: keep each run (result, report, model calls) there, to read after a failure.
    if (process.env.HOSTILE_DUMP) await writeFile(path.join(process.env.HOSTILE_DUMP, `${name}.json`), JSON.stringify({ result, report, calls: await callsOf(result!.episodeId).catch(() => []) }, null, 1));
    await waitForNoContainers(plan.batchId, 60_000);
    return { result: result!, stdout, report, ms };
  }

  /** The run passed the verifier; the message carries everything needed to see why not. */
  function expectGraded(r: Run) {
    expect([r.result.status, r.result.reward], `${JSON.stringify(r.result)}\n${r.stdout.slice(0, 4000)}`).toEqual(['passed', 1]);
  }

  const isChat = (c: CallLine) => c.path === '/v1/chat/completions';
  const isRefusal = (statuses: number[]) => statuses.every((s) => s >= 400 && s < 500);

  it('slowloris, garbage, other protocols and a 100 MB header: the model still answers, the worker runs the next episode', async () => {
    await useWorker({ maxCalls: 20 });
    const flood = await run('hostile-flood', 'flood.mjs', { config: { idle: 400 } });
    expectGraded(flood);
    const r = flood.report;
    expect(r.idleOpened, flood.stdout).toBeGreaterThan(300);
    // Nothing that is not a well-formed allowed request got anything but a refusal (or no answer).
    for (const statuses of [...r.garbage, r.ssh, r.tls, r.http2, r.nul]) expect(isRefusal(statuses), JSON.stringify(r)).toBe(true);
    expect(isRefusal(r.big.statuses), JSON.stringify(r.big)).toBe(true);
    // With 400 idle connections still open, the agent's own calls are answered.
    expect([r.models, r.chat], JSON.stringify(r)).toEqual([200, 200]);
    const calls = await callsOf(flood.result.episodeId);
    expect(calls.filter(isChat).filter((c) => c.outcome === 'answered')).toHaveLength(1);

    // The same worker, straight after: an ordinary episode runs normally.
    const next = await run('hostile-after-flood', 'probe.mjs');
    expectGraded(next);
    expect([next.report.models, next.report.chat]).toEqual([200, 200]);
  });

  it('an agent that holds hundreds of connections and an unread stream forever is ended at its deadline', async () => {
    await useWorker({ maxCalls: 20 });
    // deadline 60 s: setup 20 + verify 20 + close 10 leave the agent 10 s.
    const timing = 'deadlineSec: 60\nreserves: { setupSec: 20, verifySec: 20, closeSec: 10 }';
    const hang = await run('hostile-hang', 'flood.mjs', { config: { idle: 400, hang: true }, timing }, 120_000);
    expect(hang.report.chat, hang.stdout).toBe(200);
    expect(hang.result.agent?.timedOut, JSON.stringify(hang.result)).toBe(true);
    expect(hang.result.timings.totalMs, JSON.stringify(hang.result)).toBeLessThanOrEqual(60_000);
    expect(hang.ms).toBeLessThan(90_000);
    // Both chat calls recorded: the answered one, and the stream nobody read, whatever became of it.
    const calls = (await callsOf(hang.result.episodeId)).filter(isChat);
    expect(calls.length, JSON.stringify(calls)).toBe(2);
    expect(calls.filter((c) => c.request?.stream)).toHaveLength(1);
    const next = await run('hostile-after-hang', 'probe.mjs');
    expectGraded(next);
  });

  it('every route but the two allowed is refused, nothing reaches the canary, the agent cannot speak for the episode', async () => {
    await useWorker({ maxCalls: 20 });
    recorder.seen.length = 0;
    const stubCallsBefore = stub.calls().length;
    const r = await run('hostile-paths', 'paths.mjs', { config: { canaryPort: canary.port } });
    expectGraded(r);
    const refused = r.report.refused as Record<string, { statuses: number[]; head: string }>;
    const notRefused = Object.entries(refused).filter(([, v]) => !isRefusal(v.statuses)).map(([k, v]) => `${k}: ${v.head}`);
    expect(notRefused, 'requests that got something other than a refusal').toEqual([]);
    // The allowed call first, then the forbidden one on the same connection: refused too.
    expect(r.report.pipelined[0]).toBe(200);
    expect(isRefusal(r.report.pipelined.slice(1)), JSON.stringify(r.report.pipelined)).toBe(true);
    // No absolute-form target, CONNECT or Host header took any byte to the host's canary.
    expect(canary.hits()).toBe(0);
    // The upstream only ever saw the two allowed routes.
    const routes = [...new Set(recorder.seen.map((s) => `${s.method} ${s.url.split('?')[0]}`))];
    expect(routes.filter((x) => x !== 'POST /v1/chat/completions' && x !== 'GET /v1/models'), JSON.stringify(routes)).toEqual([]);
    // The agent's own Authorization and identity headers changed nothing: the real key went upstream, the call was the episode's.
    expect(r.report.spoof.status, JSON.stringify(r.report.spoof)).toBe(200);
    for (const s of recorder.seen) {
      expect(s.headers.authorization).toBe(`Bearer ${API_KEY}`);
      const spoofed = Object.entries(s.headers).filter(([k, v]) => /task|episode|auth|host|forwarded|real-ip|api-key/i.test(k) && String(v).includes('spoof'));
      expect(spoofed, `headers the agent set reached the upstream: ${JSON.stringify(s.headers)}`).toEqual([]);
    }
    const stubCalls = stub.calls().slice(stubCallsBefore);
    expect(stubCalls.every((c) => c.taskId === 'fix-greeting' && c.episodeId === r.result.episodeId), JSON.stringify(stubCalls)).toBe(true);
  });

  it('an agent that kills the forwarder, takes its port and goes for the proxy socket: the budget holds, the key is nowhere', async () => {
    const maxCalls = 4;
    await useWorker({ maxCalls });
    const r = await run('hostile-takeover', 'takeover.mjs', { config: { directCalls: 6 } });
    expectGraded(r);
    const rep = r.report;
    expect(rep.first).toBe(200);
    expect(rep.env.OPENAI_BASE_URL).toBe('http://127.0.0.1:8377/v1');
    expect(rep.env.OPENAI_API_KEY).not.toBe(API_KEY);
    // The key: in no environment, command line or file; no host process or engine socket visible.
    expect(rep.hunt.filesRead, JSON.stringify(rep.hunt)).toBeGreaterThan(3);
    expect(rep.hunt.found.filter((k: string) => k.includes('real-key') || k === API_KEY), JSON.stringify(rep.hunt)).toEqual([]);
    expect(r.stdout).not.toContain(API_KEY);
    expect(rep.dockerSock).toBe(false);
    const cmdlines = (rep.processes as { cmdline: string }[]).map((p) => p.cmdline).join('\n');
    expect(cmdlines).not.toMatch(/redis-server|dockerd|containerd|vitest|rollout-fleet worker/);
    // Whatever the agent reached directly, it never got past the call budget, nor anything but the two routes.
    let answeredByAgent = rep.first === 200 ? 1 : 0;
    for (const [socketPath, d] of Object.entries(rep.direct as Record<string, { chats: (number | string)[]; forbidden: Record<string, number[]> }>)) {
      answeredByAgent += d.chats.filter((c) => c === 200).length;
      for (const [name, statuses] of Object.entries(d.forbidden)) expect(isRefusal(statuses), `${socketPath} ${name}: ${JSON.stringify(statuses)}`).toBe(true);
    }
    expect(answeredByAgent, JSON.stringify(rep.direct)).toBeLessThanOrEqual(maxCalls);
    const calls = await callsOf(r.result.episodeId);
    expect(calls.filter(isChat).filter((c) => c.outcome === 'answered').length, JSON.stringify(calls.map((c) => [c.path, c.outcome]))).toBeLessThanOrEqual(maxCalls);
    expect(JSON.stringify(calls)).not.toContain(API_KEY);
  });

  it('an agent that kills the forwarder and carries on: its own exit code is what the result reports', async () => {
    await useWorker({ maxCalls: 20 });
    const r = await run('hostile-killfwd', 'killfwd.mjs', { config: { exitCode: 3 } });
    expect(r.report, r.stdout).toMatchObject({ stillAlive: true });
    expect(r.report.killed.length, r.stdout).toBe(1);
    expect(r.result.agent?.exitCode, JSON.stringify(r.result)).toBe(3);
    expectGraded(r);
  });

  it('parallel calls past the token budget: the tokens answered exceed it by at most one call', async () => {
    // One call of the scripted policy costs about 52 tokens: the budget holds two of them.
    const maxTokens = 110;
    recorder.setTarget(slowStub.baseUrl!);
    try {
      await useWorker({ maxCalls: 100, maxTokens });
      const r = await run('hostile-tokens', 'tokens.mjs', { config: { parallel: 20 } });
      expectGraded(r);
      const tokens = r.report.tokens as number[];
      expect(tokens.length, JSON.stringify(r.report)).toBeGreaterThan(0);
      const perCall = Math.max(...tokens);
      const answered = (await callsOf(r.result.episodeId)).filter(isChat).filter((c) => c.outcome === 'answered') as (CallLine & { tokens?: number })[];
      const used = answered.reduce((sum, c) => sum + (c.tokens ?? 0), 0);
      expect(used, `${answered.length} calls answered, ${used} tokens against a budget of ${maxTokens}: ${JSON.stringify(r.report.statuses)}`).toBeLessThanOrEqual(maxTokens + perCall);
    } finally {
      recorder.setTarget(stub.baseUrl!);
    }
  });

  it('parallel streams past the call budget, some read with long pauses: answered calls never exceed it, every call is recorded', async () => {
    const maxCalls = 3;
    recorder.setTarget(slowStub.baseUrl!);
    try {
      await useWorker({ maxCalls });
      const r = await run('hostile-budget', 'budget.mjs', { config: { parallel: 12 } });
      expectGraded(r);
      const rep = r.report;
      const ok = (rep.streams as { status: number; done: boolean }[]).filter((s) => s.status === 200);
      expect(ok.length, JSON.stringify(rep.streams)).toBeLessThanOrEqual(maxCalls);
      expect(ok.length, JSON.stringify(rep.streams)).toBeGreaterThan(0);
      // The ones answered (the paused readers too) ran to [DONE]; the others were refused with 429 budget errors.
      expect(ok.every((s) => s.done), JSON.stringify(ok)).toBe(true);
      expect((rep.streams as { status: number }[]).filter((s) => s.status !== 200).every((s) => s.status === 429), JSON.stringify(rep.streams)).toBe(true);
      expect(rep.plain.status).toBe(429);
      expect(rep.nStream.status, JSON.stringify(rep.nStream)).toBe(400);
      expect(JSON.stringify(rep.nStream.error)).toMatch(/\bn\b/);
      const calls = await callsOf(r.result.episodeId);
      expect(calls.filter((c) => c.outcome === 'answered').length, JSON.stringify(calls.map((c) => c.outcome))).toBeLessThanOrEqual(maxCalls);
      expect(calls.length, JSON.stringify(calls.map((c) => [c.outcome, c.status]))).toBe(rep.requests);
    } finally {
      recorder.setTarget(stub.baseUrl!);
    }
  });

  it('the upstream goes away mid-stream: the agent gets an error event, the episode ends and is graded, the evidence says so', async () => {
    recorder.setTarget(slowStub.baseUrl!);
    recorder.setMode({ kind: 'cutAfterEvents', events: 2 });
    const cutsBefore = recorder.cuts();
    try {
      await useWorker({ maxCalls: 20, upstreamRetries: 1 });
      const r = await run('hostile-cut', 'cut.mjs');
      expect(recorder.cuts()).toBeGreaterThan(cutsBefore);
      expectGraded(r);
      const s = r.report.stream;
      expect(s.status, JSON.stringify(s)).toBe(200);
      expect(s.done, JSON.stringify(s)).toBe(false);
      const last = JSON.parse(s.last) as { error?: { type?: string; message?: string } };
      expect(last.error, JSON.stringify(s)).toMatchObject({ type: expect.any(String), message: expect.any(String) });
      const calls = await callsOf(r.result.episodeId);
      expect(['upstream_failed', 'aborted'], JSON.stringify(calls)).toContain(calls[0]!.outcome);
      expect(calls[0]!.request?.stream).toBe(true);
    } finally {
      recorder.setMode({ kind: 'pass' });
      recorder.setTarget(stub.baseUrl!);
    }
  });

  it('an upstream that resets every connection: the agent gets an error answer, the episode is graded, the call is upstream_failed', async () => {
    recorder.setMode({ kind: 'refuse' });
    try {
      await useWorker({ maxCalls: 20, upstreamRetries: 1 });
      const r = await run('hostile-refuse', 'cut.mjs');
      expectGraded(r);
      const s = r.report.stream;
      // Refused before the stream began (an HTTP error) or as an error event: never [DONE], never hung.
      expect(s.done, JSON.stringify(s)).toBe(false);
      if (s.status === 200) expect(JSON.parse(s.last).error, JSON.stringify(s)).toBeDefined();
      else expect(s.status, JSON.stringify(s)).toBeGreaterThanOrEqual(500);
      expect(r.report.after.status, JSON.stringify(r.report.after)).toBeGreaterThanOrEqual(500);
      const calls = await callsOf(r.result.episodeId);
      expect(calls.map((c) => c.outcome), JSON.stringify(calls)).toEqual(['upstream_failed', 'upstream_failed']);
    } finally {
      recorder.setMode({ kind: 'pass' });
    }
  });

  it('a careless user: model: true on a worker with no endpoint fails with kind model naming MODEL_BASE_URL; model: "yes" is rejected at enqueue', async () => {
    await useWorker(null);
    const r = await run('careless-model-true', 'probe.mjs', { model: 'true' });
    expect(r.result.status, JSON.stringify(r.result)).toBe('error');
    expect(r.result.error?.kind, JSON.stringify(r.result)).toBe('model');
    expect(r.result.error?.message, JSON.stringify(r.result)).toContain('MODEL_BASE_URL');

    const wrongType = await batchFile('careless-model-yes', 'probe.mjs', { model: '"yes"' });
    const enqueue = await runCli(['enqueue', wrongType], env.env);
    expect(enqueue.code, enqueue.stderr).toBe(2);
    expect(enqueue.stderr).toContain('agent.model');
    expect(enqueue.stderr).toContain('"yes"');
    expect(enqueue.stdout).toBe('');
  });

  it('model: false on a worker with an endpoint: no OPENAI_* variables, nothing on the port, no model evidence', async () => {
    await useWorker({ maxCalls: 20 });
    const r = await run('careless-model-false', 'probe.mjs', { model: 'false' });
    expectGraded(r);
    expect(r.report, r.stdout).toMatchObject({ baseUrl: null, apiKey: null, models: 0, modelsError: 'ECONNREFUSED' });
    expect(await readdir(evidenceDir(r.result.episodeId))).not.toContain('model-calls.jsonl');
  });
});
