// Any agent, any OpenAI-compatible client: command agents written against the official `openai`
// package (bundled into the task, run with the runtime's node) find the model at OPENAI_BASE_URL, a
// loopback address that the model forwarder relays to the episode's proxy, in a sandbox that still
// has network none. Streamed and not; the real key nowhere in the sandbox; a client that goes away
// mid-stream aborts the upstream call.
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import { SANDBOX_API_KEY } from '../../src/agent/command-agent.ts';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { MODEL_CALLS_FILE } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { RUNTIME_MOUNT_PATH } from '../../src/runtime/runtime-inputs.ts';
import { EXAMPLES, ROOT, enqueueFile, silentLog, startEnvWorker, startFleetEnv, waitFor, waitForNoContainers, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const API_KEY = `sk-gateway-${process.pid}-real-key-stays-out`;
const TASK = path.join(EXAMPLES, 'tasks', 'fix-greeting');

describe('model gateway: any agent through OPENAI_BASE_URL', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let worker: WorkerHandle;
  let agentBundle: string;

  beforeAll(async () => {
    env = await startFleetEnv();
    // Events 20 ms apart: a stream is still flowing when the disconnecting agent goes away.
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0 }, requireKey: API_KEY, streamChunkDelayMs: 20, log: silentLog });
    worker = await startEnvWorker(env, 'gateway-w', { concurrency: 3, callTimeoutMs: 30_000, outputCapBytes: 256 * 1024, model: { baseUrl: stub.baseUrl!, apiKey: API_KEY, maxCalls: 20, maxTokens: 200_000, requestTimeoutMs: 30_000, upstreamRetries: 1 } });
    const out = await build({ entryPoints: [path.join(ROOT, 'test/fixtures/openai-agent.ts')], bundle: true, platform: 'node', format: 'esm', target: 'node20', write: false, logLevel: 'silent' });
    agentBundle = out.outputFiles[0]!.text;
  });
  afterAll(async () => {
    await worker?.close();
    await stub?.close();
    await env?.close();
  });

  /** fix-greeting with the bundled openai agent in its workspace, run by a command agent. */
  async function batch(name: string, args: string): Promise<string> {
    const file = await writeBatch(
      `name: ${name}\ntasks: [tasks/fix-greeting]\nsamples: 1\nagent: { kind: command, command: ${JSON.stringify(`${RUNTIME_MOUNT_PATH}/bin/node agent.mjs ${args}`)} }\n`,
      {
        'fix-greeting': {
          yaml: await readFile(path.join(TASK, 'task.yaml'), 'utf8'),
          files: {
            'workspace/greet.sh': await readFile(path.join(TASK, 'workspace/greet.sh'), 'utf8'),
            'workspace/agent.mjs': agentBundle,
            'tests/test.sh': await readFile(path.join(TASK, 'tests/test.sh'), 'utf8'),
          },
        },
      },
    );
    return file;
  }

  const evidence = (episodeId: string, file: string) => readFile(path.join(env.dataDir, 'evidence', episodeId, 'attempt-1', file), 'utf8');
  const callsOf = async (episodeId: string) => (await evidence(episodeId, MODEL_CALLS_FILE)).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);

  it('an agent on the openai package solves the task, streamed and not, and finds no trace of the key', async () => {
    const plans = [await enqueueFile(env, await batch('gw-stream', '--stream')), await enqueueFile(env, await batch('gw-plain', ''))];
    for (const [plan, streamed] of [[plans[0]!, true], [plans[1]!, false]] as const) {
      const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
      const stdout = await evidence(result!.episodeId, 'agent.stdout.txt');
      expect([result!.status, result!.reward], `${JSON.stringify(result!.error)}\n${stdout}`).toEqual(['passed', 1]);
      expect(stdout).toMatch(new RegExp(`FINISHED turns=\\d+ stream=${streamed}`));
      const scan = JSON.parse(/^SCAN (.*)$/m.exec(stdout)![1]!) as { found: string[]; filesRead: number };
      // The scan works (it finds the placeholder in its own environment and /proc, and reads files) ...
      expect(scan.found).toContain(SANDBOX_API_KEY);
      expect(scan.filesRead).toBeGreaterThan(3);
      // ... and the real key is in no environment, command line or file of the sandbox.
      expect(scan.found.filter((k) => k.includes('real-key'))).toEqual([]);
      const calls = await callsOf(result!.episodeId);
      expect(calls.length).toBeGreaterThanOrEqual(3);
      for (const call of calls) {
        expect(call).toMatchObject({ outcome: 'answered', status: 200 });
        expect((call.request as { stream?: boolean }).stream ?? false).toBe(streamed);
        if (streamed) expect(call.stream!.events).toBeGreaterThan(2);
      }
      expect(JSON.stringify(calls)).not.toContain(API_KEY);
      await waitForNoContainers(plan.batchId);
    }
  });

  it('a client that goes away mid-stream aborts the upstream call: the stub sees it, the evidence records it', async () => {
    const before = stub.streams();
    const plan = await enqueueFile(env, await batch('gw-disconnect', '--stream --disconnect'));
    const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect(await evidence(result!.episodeId, 'agent.stdout.txt')).toContain('DISCONNECTED after 2 events');
    await waitFor('the stub to see the stream aborted', async () => stub.streams().aborted > before.aborted);
    const calls = await callsOf(result!.episodeId);
    expect(calls).toHaveLength(1);
    expect(calls[0]).toMatchObject({ outcome: 'aborted' });
    await waitForNoContainers(plan.batchId);
  });
});
