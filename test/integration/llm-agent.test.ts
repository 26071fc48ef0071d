// The reference LLM agent end to end: runtime generation mounted, model proxy as the sandbox's one
// way out, the scripted policy server standing in for a model that demands an API key the sandbox
// never sees. And, from inside a sandbox: the model socket works, nothing else does.
import { mkdtemp, readFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { prepareRuntime } from '../../src/runtime/prepare-runtime.ts';
import { defaultRuntimeInputs } from '../../src/runtime/runtime-inputs.ts';
import { SandboxSession } from '../../src/sandbox/sandbox-session.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { EXAMPLES, docker, silentLog, startFleetEnv, waitForNoContainers, waitForResults, type FleetEnv, startEnvWorker, enqueueFile } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const API_KEY = `sk-test-${process.pid}-never-in-a-sandbox`;

describe('reference LLM agent', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0, host: '127.0.0.1' }, requireKey: API_KEY, log: silentLog });
    worker = await startEnvWorker(env, 'llm-w', { concurrency: 3, callTimeoutMs: 30_000, outputCapBytes: 256 * 1024, model: { baseUrl: stub.baseUrl!, apiKey: API_KEY, maxCalls: 20, maxTokens: 200_000, requestTimeoutMs: 30_000, upstreamRetries: 2 } });
  });
  afterAll(async () => {
    await worker?.close();
    await stub?.close();
    await env?.close();
  });

  it('solves the example tasks through the proxy, with the runtime mounted, and keeps the key out', async () => {
    const file = await writeBatch(`tasks: [${JSON.stringify(path.join(EXAMPLES, 'tasks'))}]\nagent: { kind: llm, maxTurns: 10 }\n`, {});
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 180_000);
    for (const r of results) {
      const expected = r.taskId === 'reverse-lines' ? ['failed', 0] : ['passed', 1];
      expect([r.status, r.reward], `${r.episodeId}: ${JSON.stringify(r.error)}`).toEqual(expected);
      expect(r.runtime?.generationId).toMatch(/^[0-9a-f]{64}$/);
      expect(r.usage?.totalTokens).toBeGreaterThan(0);
      const calls = await readFile(path.join(env.dataDir, 'evidence', r.episodeId, 'attempt-1', MODEL_CALLS_FILE), 'utf8');
      expect(calls.trim().split('\n').length).toBeGreaterThanOrEqual(2);
      expect(calls).not.toContain(API_KEY);
    }
    // One generation for all; after the first preparation in this process, warm and fast.
    expect(new Set(results.map((r) => r.runtime?.generationId)).size).toBe(1);
    expect(results.filter((r) => r.runtime?.warm).length).toBeGreaterThanOrEqual(results.length - 1);
    // No turn of any episode was asked of the model twice.
    expect(stub.calls().every((c) => c.count === 1)).toBe(true);
    await waitForNoContainers(plan.batchId);
  });

  it('from inside a sandbox: the model socket answers, other paths and over-budget calls are refused, Redis and the key are out of reach', async () => {
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-wayout-'));
    const runtime = await prepareRuntime({ docker, redis: env.client, prefix: env.prefix, log: silentLog }, await defaultRuntimeInputs([], { cacheDir: path.join(dataDir, 'cache') }));
    const proxy = await startModelProxy({
      socketPath: modelSocketPath(dataDir, 'probe'), upstreamBaseUrl: stub.baseUrl!, apiKey: API_KEY,
      budget: { maxCalls: 2, maxTokens: 100_000 }, evidenceFile: path.join(dataDir, 'calls.jsonl'),
      episodeId: 'probe', taskId: 'fix-greeting', log: silentLog,
    });
    const owner = { fleet: env.prefix, episodeId: 'probe', batchId: 'probe', workerId: worker.workerId, attempt: 1 };
    const session = await SandboxSession.open({ docker, log: silentLog, callTimeoutMs: 30_000 }, {
      image: DEFAULT_IMAGE, workdir: '/workspace', limits: { memoryMb: 1024, cpus: 1, pids: 64 }, owner,
      mounts: [runtime.mount], bindFolders: [path.dirname(proxy.socketPath)],
    }, () => undefined);
    try {
      const probe = `
        const http = require('node:http'), net = require('node:net');
        const call = (method, path, body) => new Promise((resolve) => {
          const req = http.request({ socketPath: ${JSON.stringify(proxy.socketPath)}, method, path, headers: { 'content-type': 'application/json' } },
            (res) => { let t = ''; res.on('data', (c) => (t += c)); res.on('end', () => resolve(res.statusCode + ' ' + (JSON.parse(t).error?.type ?? 'ok'))); });
          req.on('error', (e) => resolve('error ' + e.code));
          req.end(body ? JSON.stringify(body) : undefined);
        });
        const chat = { model: 'm', messages: [{ role: 'user', content: 'greet.sh should print' }] };
        (async () => {
          const out = [];
          out.push(await call('POST', '/v1/chat/completions', chat));
          out.push(await call('GET', '/admin'));
          out.push(await call('POST', '/v1/chat/completions', chat));
          out.push(await call('POST', '/v1/chat/completions', chat));
          out.push(await new Promise((resolve) => {
            const s = net.connect(${env.redis.port}, '127.0.0.1', () => resolve('redis reached'));
            s.on('error', (e) => resolve('redis ' + e.code));
          }));
          console.log(out.join('\\n'));
        })();`;
      const res = await session.exec(`cat > /tmp/probe.cjs <<'PROBE'\n${probe}\nPROBE\n/opt/rollout-fleet/bin/node /tmp/probe.cjs`, { timeoutMs: 30_000, capBytes: 64 * 1024 });
      expect(res.stderr.text).toBe('');
      expect(res.stdout.text.trim().split('\n')).toEqual(['200 ok', '404 not_found', '200 ok', '429 budget_exceeded', 'redis ECONNREFUSED']);
      // The key is nowhere in the sandbox: not in its environment, not in any file it can read.
      const dirs = '/bin /etc /tmp /workspace /opt /home /root /var /usr /run';
      // A planted control string proves the search would find the key if it were there.
      // A search that printed nothing at all (not even wc's count: its shell was killed under load, as
      // seen in CI) is run once more; a count it printed is what is asserted.
      const count = async (command: string) => {
        let shown = '';
        for (let i = 0; i < 2; i++) {
          const r = await session.exec(command, { timeoutMs: 60_000, capBytes: 4096 });
          shown = `${r.stdout.text.trim()}${r.timedOut ? ' (timed out)' : ''}`;
          if (shown !== '') return shown;
          shown = `(no output, exit ${r.exitCode})`;
        }
        return shown;
      };
      const find = (needle: string) => `for d in ${dirs}; do [ -d $d ] && grep -rl ${needle} $d; done 2>/dev/null | wc -l`;
      await count(`echo control-${process.pid} > /tmp/control.txt`);
      expect(await count(find(`control-${process.pid}`))).toBe('1');
      expect(await count(find(API_KEY))).toBe('0');
      expect(await count(`env | grep -c ${API_KEY}`)).toBe('0');
    } finally {
      await session.remove();
      await proxy.close();
    }
  });
});
