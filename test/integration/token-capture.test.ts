// Token-exact capture end to end: a batch that asks for `model: { capture: tokens }` has the proxy
// ask the endpoint (the scripted policy server, answering in vLLM's shapes) for token ids and logprobs;
// they reach each attempt's model-calls.jsonl and trajectory.json unchanged, for every assistant turn,
// whether the agent streamed (an agent on the openai package) or not (the reference agent).
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { build } from 'esbuild';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WorkerHandle } from '../../src/worker/start-worker.ts';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { TRAJECTORY_FILE, type Trajectory } from '../../src/evidence/trajectory.ts';
import type { TrajectoryRecord } from '../../src/results/trajectory-export.ts';
import { ChatRequest } from '../../src/model/chat-protocol.ts';
import { MODEL_CALLS_FILE } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { stubTokens } from '../../src/model/stub-tokens.ts';
import { RUNTIME_MOUNT_PATH } from '../../src/runtime/runtime-inputs.ts';
import { EXAMPLES, ROOT, enqueueFile, runCli, silentLog, startEnvWorker, startFleetEnv, waitForResults, type FleetEnv } from '../helpers/fleet.ts';
import { writeBatch } from '../helpers/scratch-tasks.ts';

const TASK = path.join(EXAMPLES, 'tasks', 'fix-greeting');

type Message = { content?: string | null; tool_calls?: { function: { arguments: string } }[] };

describe('token-exact capture', () => {
  let env: FleetEnv;
  let stub: ModelStub;
  let worker: WorkerHandle;

  beforeAll(async () => {
    env = await startFleetEnv();
    stub = await startModelStub({ tasksDir: path.join(EXAMPLES, 'tasks'), listen: { port: 0 }, log: silentLog });
    worker = await startEnvWorker(env, 'capture-w', { concurrency: 4, callTimeoutMs: 30_000, outputCapBytes: 256 * 1024, model: { baseUrl: stub.baseUrl!, maxCalls: 30, maxTokens: 500_000, requestTimeoutMs: 30_000, upstreamRetries: 1 } });
  });
  afterAll(async () => {
    await worker?.close();
    await stub?.close();
    await env?.close();
  });

  async function check(episodeId: string): Promise<number> {
    const folder = path.join(env.dataDir, 'evidence', episodeId, 'attempt-1');
    const calls = (await readFile(path.join(folder, MODEL_CALLS_FILE), 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
    const trajectory = JSON.parse(await readFile(path.join(folder, TRAJECTORY_FILE), 'utf8')) as Trajectory;
    const answeredCalls = calls.filter((c) => c.outcome === 'answered');
    expect(answeredCalls.length).toBeGreaterThanOrEqual(3);
    // Every assistant turn of the conversation is a turn of the trajectory, with its tokens.
    const assistantMessages = trajectory.messages.filter((m) => (m as { role: string }).role === 'assistant');
    expect(trajectory.turns).toHaveLength(answeredCalls.length);
    expect(assistantMessages).toHaveLength(answeredCalls.length);
    expect(trajectory.turnsWithTokenIds).toBe(answeredCalls.length);
    for (const [i, call] of answeredCalls.entries()) {
      const request = call.request as { messages: unknown[]; tools?: unknown[] };
      const message = (call.response as { choices: { message: Message }[] }).choices[0]!.message;
      // What the stub generated, token by token: the tool call's arguments, or the text.
      const completion = stubTokens(message.tool_calls?.[0]?.function.arguments ?? message.content ?? '', 'completion');
      // The stub reads the prompt as its schema parses it (keys in the schema's order), as a tokenizer would.
      const prompt = stubTokens(JSON.stringify(ChatRequest.parse(request).messages) + JSON.stringify(request.tools ?? []), 'prompt');
      expect(call.capture!.choices[0]!.tokenIds).toEqual(completion.map((t) => t.id));
      expect(call.capture!.choices[0]!.logprobs).toEqual(completion.map((t) => t.logprob));
      expect(call.capture!.promptTokenIds).toEqual(prompt.map((t) => t.id));
      const turn = trajectory.turns[i]!;
      expect(turn.seq).toBe(call.seq);
      expect(turn.completionTokenIds).toEqual(completion.map((t) => t.id));
      expect(turn.logprobs).toEqual(completion.map((t) => t.logprob));
      expect(turn.promptTokenIds).toEqual(prompt.map((t) => t.id));
      // The turn's answer sits in the conversation right after its prompt.
      expect(turn.messageIndex).toBe(request.messages.length);
      expect(trajectory.messages[turn.messageIndex]).toEqual(message);
    }
    return answeredCalls.length;
  }

  it('reaches the evidence and the trajectory unchanged for every turn of the reference agent (not streamed)', async () => {
    const file = await writeBatch(`name: capture-llm\ntasks: [${JSON.stringify(path.join(EXAMPLES, 'tasks'))}]\nagent: { kind: llm, maxTurns: 10 }\nmodel: { capture: tokens }\n`, {});
    const plan = await enqueueFile(env, file);
    const results = await waitForResults(env, plan.batchId, plan.jobs.length, 180_000);
    let turns = 0;
    for (const r of results) {
      expect(r.status === 'passed' || r.taskId === 'reverse-lines', `${r.episodeId}: ${JSON.stringify(r.error)}`).toBe(true);
      turns += await check(r.episodeId);
    }
    expect(turns).toBeGreaterThanOrEqual(3 * results.length);

    // `results --format trajectories`: one line per episode, its result and its trajectory, unchanged.
    const exported = await runCli(['results', plan.batchId, '--format', 'trajectories'], env.env);
    expect(exported.code, exported.stderr).toBe(0);
    const records = exported.stdout.trim().split('\n').map((l) => JSON.parse(l) as TrajectoryRecord);
    expect(records.map((r) => r.episodeId).sort()).toEqual(results.map((r) => r.episodeId).sort());
    for (const record of records) {
      const result = results.find((r) => r.episodeId === record.episodeId)!;
      expect(record).toMatchObject({ taskId: result.taskId, status: result.status, reward: result.reward, attempts: result.attempts });
      const onDisk = JSON.parse(await readFile(path.join(env.dataDir, 'evidence', record.episodeId, 'attempt-1', TRAJECTORY_FILE), 'utf8')) as Trajectory;
      expect(record.trajectory).toEqual(onDisk);
      expect(record.trajectory!.turns.every((t) => (t.completionTokenIds?.length ?? 0) > 0)).toBe(true);
    }
  });

  it('reaches them unchanged for a streaming agent on the openai package', async () => {
    const out = await build({ entryPoints: [path.join(ROOT, 'test/fixtures/openai-agent.ts')], bundle: true, platform: 'node', format: 'esm', target: 'node20', write: false, logLevel: 'silent' });
    const file = await writeBatch(
      `name: capture-stream\ntasks: [tasks/fix-greeting]\nagent: { kind: command, command: ${JSON.stringify(`${RUNTIME_MOUNT_PATH}/bin/node agent.mjs --stream`)} }\nmodel: { capture: tokens }\n`,
      {
        'fix-greeting': {
          yaml: await readFile(path.join(TASK, 'task.yaml'), 'utf8'),
          files: {
            'workspace/greet.sh': await readFile(path.join(TASK, 'workspace/greet.sh'), 'utf8'),
            'workspace/agent.mjs': out.outputFiles[0]!.text,
            'tests/test.sh': await readFile(path.join(TASK, 'tests/test.sh'), 'utf8'),
          },
        },
      },
    );
    const plan = await enqueueFile(env, file);
    const [result] = await waitForResults(env, plan.batchId, 1, 120_000);
    expect([result!.status, result!.reward], JSON.stringify(result!.error)).toEqual(['passed', 1]);
    await check(result!.episodeId);
  });
});
