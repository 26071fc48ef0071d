// The scripted policy really solves the example tasks: its tool calls, fetched through the model proxy
// and carried out in a real sandbox session (a minimal host-side tool loop, not the reference agent),
// leave a workspace that the task's own hidden tests pass; reverse-lines and "wrong" episodes fail.
import path from 'node:path';
import { mkdtemp, readFile } from 'node:fs/promises';
import os from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelCallRecord } from '../../src/model/call-evidence.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy } from '../../src/model/model-proxy.ts';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { isWrongEpisode } from '../../src/model/stub-script.ts';
import { SandboxSession, SANDBOX_USER } from '../../src/sandbox/sandbox-session.ts';
import { loadTask } from '../../src/tasks/load-task.ts';
import { packTask } from '../../src/tasks/pack-task.ts';
import { TaskArchive } from '../../src/tasks/task-archive.ts';
import { docker, fleetContainers, silentLog } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS, TOOLS, chat, conversation, toolCallOf } from '../helpers/model.ts';

const KEY = 'sk-sandbox-e2e-51d0';
const WRONG_FRACTION = 0.5;
const batchId = `stub-sandbox-${process.pid}`;

/** An episode id of the batch that the stub treats as right (or wrong) at WRONG_FRACTION. */
function episodeId(taskId: string, wrong: boolean): string {
  for (let i = 0; ; i++) {
    const id = `${batchId}.${taskId}.${i}`;
    if (isWrongEpisode(id, WRONG_FRACTION) === wrong) return id;
  }
}

describe('scripted policy in a real sandbox', () => {
  let stub: ModelStub;
  let dataDir: string;

  beforeAll(async () => {
    stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, wrongFraction: WRONG_FRACTION, requireKey: KEY, log: silentLog });
    dataDir = await mkdtemp(path.join(os.tmpdir(), 'rf-stub-sandbox-'));
  });
  afterAll(async () => {
    await stub?.close();
    expect(await fleetContainers('batch', batchId)).toEqual([]);
  });

  async function runEpisode(taskId: string, wrong: boolean) {
    const dir = path.join(EXAMPLE_TASKS, taskId);
    const { spec } = await loadTask(dir);
    const packed = await packTask(dir);
    const archive = await TaskArchive.fromBuffer(packed.archive, packed.digest);
    const id = episodeId(taskId, wrong);
    const evidenceFile = path.join(dataDir, 'evidence', id, MODEL_CALLS_FILE);
    const proxy = await startModelProxy({
      socketPath: modelSocketPath(dataDir, id), upstreamBaseUrl: stub.baseUrl!, apiKey: KEY, budget: { maxCalls: 10, maxTokens: 50_000 },
      evidenceFile, episodeId: id, taskId, log: silentLog,
    });
    const owner = { fleet: 'stub-sandbox-test', episodeId: id, batchId, workerId: 'stub-sandbox-test', attempt: 1 };
    const session = await SandboxSession.open({ docker, log: silentLog, callTimeoutMs: 30_000 }, { image: spec.image, workdir: spec.workdir, limits: { memoryMb: 64, cpus: 0.5, pids: 64 }, owner }, () => undefined);
    try {
      await session.putArchive(await archive.partAsTar('workspace', spec.workdir, SANDBOX_USER), '/');
      const turns: Parameters<typeof conversation>[1] = [];
      for (let i = 0; i < 10; i++) {
        const answer = await chat({ socketPath: proxy.socketPath }, { messages: conversation(spec.instruction, turns), tools: TOOLS });
        expect(answer.status, answer.text).toBe(200);
        const call = toolCallOf(answer);
        if (call === undefined || call.name === 'finish') break;
        const run = (command: string, env: Record<string, string> = {}, timeoutSec = 20) => session.exec(command, { timeoutMs: timeoutSec * 1000, capBytes: 64 * 1024, env });
        const a = call.args as { path: string; content: string; command: string; timeoutSec?: number };
        const result = call.name === 'write_file'
          ? await run('mkdir -p "$(dirname "$P")" && printf %s "$B64" | base64 -d > "$P"', { P: a.path, B64: Buffer.from(a.content).toString('base64') })
          : call.name === 'read_file'
            ? await run('cat "$P"', { P: a.path })
            : await run(a.command, {}, a.timeoutSec);
        turns.push({ toolCallId: call.id, name: call.name, arguments: JSON.stringify(call.args), result: `exit ${result.exitCode}\n${result.stdout.text}${result.stderr.text}` });
      }
      await session.putArchive(await archive.partAsTar('tests', '/tests', SANDBOX_USER), '/');
      const verdict = await session.exec(spec.verify.command, { timeoutMs: spec.verify.timeoutSec * 1000, capBytes: 64 * 1024 });
      const records = (await readFile(evidenceFile, 'utf8')).trim().split('\n').map((l) => JSON.parse(l) as ModelCallRecord);
      return { id, turns, verdict, records, stats: proxy.stats() };
    } finally {
      await session.remove();
      await proxy.close();
    }
  }

  it.each(['fix-greeting', 'set-port', 'sum-column'])('solves %s', async (taskId) => {
    const { id, turns, verdict, records, stats } = await runEpisode(taskId, false);
    expect(verdict.exitCode, verdict.stdout.text + verdict.stderr.text).toBe(0);
    const bash = turns.find((t) => t.name === 'bash')!;
    expect(bash.result).toMatch(/^exit 0\n/);
    // One model call per turn (the finish included), each asked once, all in the evidence.
    expect(stats.calls).toBe(turns.length + 1);
    expect(records.map((r) => r.outcome)).toEqual(Array(turns.length + 1).fill('answered'));
    expect(stub.calls().filter((c) => c.episodeId === id).map((c) => c.count)).toEqual(Array(turns.length + 1).fill(1));
    expect(records.at(-1)!.response).toMatchObject({ choices: [{ message: { tool_calls: [{ function: { name: 'finish' } }] } }] });
  });

  it('fails reverse-lines (its solution is wrong on purpose) and a wrong episode of a solvable task', async () => {
    const reverse = await runEpisode('reverse-lines', false);
    expect(reverse.turns.find((t) => t.name === 'bash')!.result).toMatch(/^exit 0\n/);
    expect(reverse.verdict.exitCode).toBe(1);
    const wrong = await runEpisode('fix-greeting', true);
    expect(wrong.turns.map((t) => t.name)).toEqual(['bash']);
    expect(wrong.verdict.exitCode).toBe(1);
  });
});
