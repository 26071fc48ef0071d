// The scripted policy server over real HTTP (loopback and a Unix socket): the script of each task,
// statelessness across turns and resumed conversations, the wrong-answer share, the API key check,
// and the `rollout-fleet model-stub` command itself.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readFile, stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startModelStub, type ModelStub } from '../../src/model/model-stub.ts';
import { STUB_SOLUTION_DIR, isWrongEpisode } from '../../src/model/stub-script.ts';
import { BIN, silentLog } from '../helpers/fleet.ts';
import { EXAMPLE_TASKS, TOOLS, bodyOf, chat, conversation, request, toolCallOf, type HttpAnswer, type Target } from '../helpers/model.ts';

const instruction = (task: string) => readFile(path.join(EXAMPLE_TASKS, task, 'task.yaml'), 'utf8').then((y) => /instruction: \|\n((?: {2}.*\n)+)/.exec(y)![1]!.replace(/^ {2}/gm, ''));

/** Play a task's whole script as an agent would, feeding back a tool result after every call. */
async function playScript(target: Target, taskId: string, episodeId: string, maxTurns = 10) {
  const turns: { toolCallId: string; name: string; arguments: string; result: string }[] = [];
  const answers: HttpAnswer[] = [];
  for (let i = 0; i < maxTurns; i++) {
    const answer = await chat(target, { model: 'any', messages: conversation('Solve the task.', turns), tools: TOOLS }, { 'x-rollout-task': taskId, 'x-rollout-episode': episodeId });
    expect(answer.status).toBe(200);
    answers.push(answer);
    const call = toolCallOf(answer);
    if (call === undefined) break;
    turns.push({ toolCallId: call.id, name: call.name, arguments: JSON.stringify(call.args), result: 'ok' });
  }
  return { turns, answers };
}

describe('scripted policy server', () => {
  let stub: ModelStub;
  let target: Target;

  beforeAll(async () => {
    stub = await startModelStub({ tasksDir: EXAMPLE_TASKS, listen: { port: 0 }, wrongFraction: 0.25, log: silentLog });
    target = { baseUrl: stub.baseUrl! };
  });
  afterAll(async () => {
    await stub?.close();
  });

  it('writes every solution file, runs solve.sh in the workdir, then finishes', async () => {
    const episodeId = 'stub-script-ok-0';
    expect(isWrongEpisode(episodeId, 0.25)).toBe(false);
    const { turns, answers } = await playScript(target, 'set-port', episodeId);
    const patch = await readFile(path.join(EXAMPLE_TASKS, 'set-port/solution/app.conf.patch'), 'utf8');
    const solve = await readFile(path.join(EXAMPLE_TASKS, 'set-port/solution/solve.sh'), 'utf8');
    expect(turns.map((t) => [t.name, JSON.parse(t.arguments)])).toEqual([
      ['write_file', { path: `${STUB_SOLUTION_DIR}/app.conf.patch`, content: patch }],
      ['write_file', { path: `${STUB_SOLUTION_DIR}/solve.sh`, content: solve }],
      ['bash', { command: `cd '/workspace' && SOLUTION_DIR=${STUB_SOLUTION_DIR} sh ${STUB_SOLUTION_DIR}/solve.sh`, timeoutSec: 60 }],
      ['finish', { answer: expect.any(String) }],
    ]);
    // After finish: a plain answer with no tool call, so an agent that keeps asking still ends.
    const last = bodyOf(answers.at(-1)!);
    expect(last.choices?.[0]).toMatchObject({ finish_reason: 'stop', message: { role: 'assistant', content: expect.any(String) } });
    // Realistic usage: prompt tokens grow with the conversation, total = prompt + completion.
    const usages = answers.map((a) => bodyOf(a).usage!);
    for (const u of usages) expect(u.total_tokens).toBe(u.prompt_tokens + u.completion_tokens);
    expect(usages.map((u) => u.prompt_tokens)).toEqual([...usages.map((u) => u.prompt_tokens)].sort((a, b) => a - b));
    expect(usages[1]!.prompt_tokens).toBeGreaterThan(usages[0]!.prompt_tokens);
    // Every turn of the episode was asked exactly once.
    const calls = await request(target, 'GET', '/_stub/calls');
    expect((calls.json as { calls: unknown[] }).calls.filter((c) => (c as { episodeId: string }).episodeId === episodeId)).toEqual(
      [0, 1, 2, 3, 4].map((turn) => ({ episodeId, taskId: 'set-port', turn, count: 1 })),
    );
  });

  it('is stateless: a resumed conversation continues at its own turn with the same answer', async () => {
    const { turns, answers } = await playScript(target, 'fix-greeting', 'stub-resume-0');
    // A "resumed" request of turn 2 (from a checkpointed conversation) under a new connection.
    const again = await chat(target, { messages: conversation('Solve the task.', turns.slice(0, 2)), tools: TOOLS }, { 'x-rollout-task': 'fix-greeting', 'x-rollout-episode': 'stub-resume-0' });
    expect(toolCallOf(again)).toEqual(toolCallOf(answers[2]!));
    expect(bodyOf(again).choices).toEqual(bodyOf(answers[2]!).choices);
    expect(bodyOf(again).usage).toEqual(bodyOf(answers[2]!).usage);
    expect(stub.calls().filter((c) => c.episodeId === 'stub-resume-0').map((c) => [c.turn, c.count])).toEqual([[0, 1], [1, 1], [2, 2], [3, 1]]);
  });

  it('finds the task by its instruction when no task header comes, and refuses an unknown task', async () => {
    const text = await instruction('sum-column');
    const byText = await chat(target, { messages: conversation(`Task:\n${text}`) });
    expect(toolCallOf(byText)).toMatchObject({ name: 'write_file', args: { path: `${STUB_SOLUTION_DIR}/solve.sh` } });
    expect((toolCallOf(byText)!.args.content as string)).toContain('NR > 1');

    const unknown = await chat(target, { messages: conversation('Paint the fence.') }, { 'x-rollout-task': 'no-such-task' });
    expect(unknown.status).toBe(400);
    expect(bodyOf(unknown).error).toMatchObject({ type: 'unknown_task' });
  });

  it('gives a deterministic share of episodes the wrong script', async () => {
    const ids = Array.from({ length: 400 }, (_, i) => `share-batch.fix-greeting.${i}`);
    const firstTools = await Promise.all(
      ids.map(async (id) => toolCallOf(await chat(target, { messages: conversation('x') }, { 'x-rollout-task': 'fix-greeting', 'x-rollout-episode': id }))!.name),
    );
    const wrong = ids.filter((_, i) => firstTools[i] === 'bash');
    // The solving script starts with write_file, the wrong one with a look around and then finish.
    expect(firstTools.every((t) => t === 'bash' || t === 'write_file')).toBe(true);
    expect(wrong).toEqual(ids.filter((id) => isWrongEpisode(id, 0.25)));
    expect(wrong.length / ids.length).toBeGreaterThan(0.25 - 0.06);
    expect(wrong.length / ids.length).toBeLessThan(0.25 + 0.06);
    const { turns } = await playScript(target, 'fix-greeting', wrong[0]!);
    expect(turns.map((t) => t.name)).toEqual(['bash', 'finish']);
    expect(JSON.parse(turns[0]!.arguments).command).toBe("cd '/workspace' && ls -la");
    // The share is a property of the ids: the extremes are none and all.
    expect(ids.filter((id) => isWrongEpisode(id, 0)).length).toBe(0);
    expect(ids.filter((id) => isWrongEpisode(id, 1)).length).toBe(ids.length);
  });
});

describe('rollout-fleet model-stub', () => {
  it('serves on a Unix socket, checks the key, and removes the socket on SIGTERM', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-stub-'));
    const socketPath = path.join(dir, 'stub.sock');
    const child = spawn(process.execPath, [BIN, 'model-stub', '--socket', socketPath, '--tasks', EXAMPLE_TASKS, '--require-key', 'sk-stub-cli'], {
      env: { ...process.env, LOG_LEVEL: 'warn' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    try {
      const [line] = (await once(child.stdout, 'data')) as [Buffer];
      expect(line.toString()).toBe(`unix:${socketPath}\n`);
      const target = { socketPath };
      const noKey = await chat(target, { messages: conversation('x') }, { 'x-rollout-task': 'fix-greeting' });
      expect(noKey.status).toBe(401);
      expect(bodyOf(noKey).error).toMatchObject({ type: 'unauthorized' });
      const withKey = await chat(target, { messages: conversation('x') }, { 'x-rollout-task': 'fix-greeting', authorization: 'Bearer sk-stub-cli' });
      expect(withKey.status).toBe(200);
      expect(toolCallOf(withKey)?.name).toBe('write_file');
      expect((await request(target, 'GET', '/v1/models')).json).toMatchObject({ object: 'list', data: [{ id: 'scripted-policy' }] });
    } finally {
      child.kill('SIGTERM');
    }
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code, stderr).toBe(0);
    await expect(stat(socketPath)).rejects.toMatchObject({ code: 'ENOENT' });
  });

  it('refuses bad arguments with a usage message', async () => {
    const child = spawn(process.execPath, [BIN, 'model-stub', '--port', '0', '--socket', '/tmp/x.sock', '--tasks', EXAMPLE_TASKS], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
    const [code] = (await once(child, 'exit')) as [number | null];
    expect(code).toBe(2);
    expect(stderr).toContain('give exactly one of --port and --socket');
  });
});
