// The reference agent: runs INSIDE the sandbox from the runtime generation (bundled into one file).
// A tool-calling loop over the OpenAI chat-completions protocol, through the model proxy's socket,
// with tools bash, read_file, write_file and finish. It reports to the worker with events on stdout
// (agent-events.ts) and never sends a request whose prompt plus reserved output exceeds the window.
import { spawn } from 'node:child_process';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import { BashArgs, FinishArgs, ReadFileArgs, WriteFileArgs } from '../../model/chat-protocol.ts';
import { formatEvent, type AgentEvent } from './agent-events.ts';
import { AGENT_INPUT_PATH, AgentInput } from './agent-input.ts';

const TOOL_OUTPUT_CAP = 16 * 1024;
const started = performance.now();

const TOOLS = [
  { type: 'function', function: { name: 'bash', description: 'Run a shell command in the task folder.', parameters: { type: 'object', properties: { command: { type: 'string' }, timeoutSec: { type: 'number' } }, required: ['command'] } } },
  { type: 'function', function: { name: 'read_file', description: 'Read a text file.', parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] } } },
  { type: 'function', function: { name: 'write_file', description: 'Write a text file, creating folders.', parameters: { type: 'object', properties: { path: { type: 'string' }, content: { type: 'string' } }, required: ['path', 'content'] } } },
  { type: 'function', function: { name: 'finish', description: 'Say the task is done.', parameters: { type: 'object', properties: { answer: { type: 'string' } }, required: ['answer'] } } },
];

interface Message {
  role: string;
  content?: unknown;
  tool_calls?: { id: string; function: { name: string; arguments: string } }[];
  tool_call_id?: string;
}

function emit(event: AgentEvent): void {
  process.stdout.write(formatEvent(event));
}

const estimateTokens = (value: unknown) => Math.ceil(JSON.stringify(value).length / 4);

function cap(text: string): string {
  if (text.length <= TOOL_OUTPUT_CAP) return text;
  const half = TOOL_OUTPUT_CAP / 2;
  return `${text.slice(0, half)}\n[... ${text.length - TOOL_OUTPUT_CAP} characters cut ...]\n${text.slice(-half)}`;
}

function post(socketPath: string, body: unknown): Promise<{ status: number; json: unknown }> {
  const data = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = http.request({ socketPath, path: '/v1/chat/completions', method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        try {
          resolve({ status: res.statusCode ?? 0, json: JSON.parse(text) });
        } catch {
          resolve({ status: res.statusCode ?? 0, json: { error: { message: text.slice(0, 500) } } });
        }
      });
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(data);
  });
}

function bash(command: string, cwd: string, timeoutSec: number): Promise<{ output: string; exitCode: number | null }> {
  return new Promise((resolve) => {
    const child = spawn('/bin/sh', ['-c', command], { cwd, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    const add = (c: Buffer) => {
      if (output.length < TOOL_OUTPUT_CAP * 4) output += c.toString('utf8');
    };
    child.stdout.on('data', add);
    child.stderr.on('data', add);
    const timer = setTimeout(() => {
      try {
        process.kill(-child.pid!, 'SIGKILL');
      } catch {
        child.kill('SIGKILL');
      }
      output += `\n[timed out after ${timeoutSec}s]`;
    }, timeoutSec * 1000);
    child.on('error', (err) => {
      clearTimeout(timer);
      resolve({ output: String(err), exitCode: null });
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ output: cap(output), exitCode: code });
    });
  });
}

async function runTool(name: string, rawArgs: string, input: AgentInput): Promise<{ content: string; ok: boolean; exitCode?: number | null; finish?: string }> {
  let args: unknown;
  try {
    args = JSON.parse(rawArgs);
  } catch {
    return { content: `error: arguments of ${name} are not JSON`, ok: false };
  }
  const resolvePath = (p: string) => path.resolve(input.workdir, p);
  switch (name) {
    case 'bash': {
      const a = BashArgs.safeParse(args);
      if (!a.success) return { content: `error: bash needs {command}`, ok: false };
      const r = await bash(a.data.command, input.workdir, a.data.timeoutSec ?? input.bashTimeoutSec);
      return { content: `exit code ${r.exitCode}\n${r.output}`, ok: r.exitCode === 0, exitCode: r.exitCode };
    }
    case 'read_file': {
      const a = ReadFileArgs.safeParse(args);
      if (!a.success) return { content: 'error: read_file needs {path}', ok: false };
      return readFile(resolvePath(a.data.path), 'utf8').then((t) => ({ content: cap(t), ok: true }), (e: Error) => ({ content: `error: ${e.message}`, ok: false }));
    }
    case 'write_file': {
      const a = WriteFileArgs.safeParse(args);
      if (!a.success) return { content: 'error: write_file needs {path, content}', ok: false };
      const file = resolvePath(a.data.path);
      return mkdir(path.dirname(file), { recursive: true })
        .then(() => writeFile(file, a.data.content))
        .then(() => ({ content: `wrote ${a.data.content.length} characters to ${file}`, ok: true }), (e: Error) => ({ content: `error: ${e.message}`, ok: false }));
    }
    case 'finish': {
      const a = FinishArgs.safeParse(args);
      return { content: 'finished', ok: true, finish: a.success ? a.data.answer : String(rawArgs) };
    }
    default:
      return { content: `error: unknown tool ${name}`, ok: false };
  }
}

async function main(): Promise<number> {
  const input = AgentInput.parse(JSON.parse(await readFile(process.argv[2] ?? AGENT_INPUT_PATH, 'utf8')));
  const messages: Message[] = (input.resume?.messages as Message[] | undefined) ?? [
    { role: 'system', content: `You are an agent working in a Linux sandbox, in ${input.workdir}. Use the tools to do the task, then call finish.` },
    { role: 'user', content: input.instruction },
  ];
  const usage = { ...(input.resume?.usage ?? { promptTokens: 0, completionTokens: 0, totalTokens: 0 }) };
  const priorMs = input.resume?.agentMs ?? 0;
  let turn = input.resume?.turn ?? 0;

  while (turn < input.maxTurns) {
    const promptTokens = estimateTokens({ messages, tools: TOOLS });
    if (promptTokens + input.outputReserveTokens > input.contextWindowTokens) {
      emit({ type: 'final', reason: 'context', answer: null, turns: turn });
      return 0;
    }
    const t = performance.now();
    let res: { status: number; json: unknown };
    try {
      res = await post(input.modelSocket, { model: input.model, messages, tools: TOOLS, max_tokens: input.outputReserveTokens });
    } catch (err) {
      emit({ type: 'error', kind: 'model', message: `model proxy unreachable: ${(err as Error).message}` });
      return 3;
    }
    const body = res.json as { choices?: { message?: Message; finish_reason?: string | null }[]; usage?: { prompt_tokens?: number; completion_tokens?: number; total_tokens?: number }; error?: { type?: string; message?: string } };
    if (res.status === 429 && body.error?.type === 'budget_exceeded') {
      emit({ type: 'final', reason: 'budget', answer: null, turns: turn });
      return 0;
    }
    if (res.status !== 200) {
      emit({ type: 'error', kind: 'model', message: `model call answered ${res.status}: ${body.error?.message ?? 'no message'}` });
      return 3;
    }
    const callUsage = { promptTokens: body.usage?.prompt_tokens ?? 0, completionTokens: body.usage?.completion_tokens ?? 0, totalTokens: body.usage?.total_tokens ?? 0 };
    usage.promptTokens += callUsage.promptTokens;
    usage.completionTokens += callUsage.completionTokens;
    usage.totalTokens += callUsage.totalTokens;
    const choice = body.choices?.[0];
    emit({ type: 'model_call', turn, durationMs: Math.round(performance.now() - t), usage: callUsage, finishReason: choice?.finish_reason ?? null });
    const message = choice?.message;
    if (message === undefined) {
      emit({ type: 'error', kind: 'model', message: 'model answered without a message' });
      return 3;
    }
    messages.push({ role: 'assistant', content: message.content ?? null, ...(message.tool_calls && { tool_calls: message.tool_calls }) });
    if (!message.tool_calls || message.tool_calls.length === 0) {
      emit({ type: 'final', reason: 'stopped', answer: typeof message.content === 'string' ? message.content : null, turns: turn + 1 });
      return 0;
    }
    let finished: string | undefined;
    for (const call of message.tool_calls) {
      const tt = performance.now();
      const r = await runTool(call.function.name, call.function.arguments, input);
      messages.push({ role: 'tool', tool_call_id: call.id, content: r.content });
      emit({ type: 'tool_call', turn, name: call.function.name, ok: r.ok, exitCode: r.exitCode ?? null, durationMs: Math.round(performance.now() - tt) });
      if (r.finish !== undefined) finished = r.finish;
    }
    turn += 1;
    emit({ type: 'checkpoint', seq: turn, turn, messages, usage, agentMs: priorMs + Math.round(performance.now() - started) });
    if (finished !== undefined) {
      emit({ type: 'final', reason: 'finished', answer: finished, turns: turn });
      return 0;
    }
  }
  emit({ type: 'final', reason: 'max_turns', answer: null, turns: turn });
  return 0;
}

main().then((code) => {
  process.exitCode = code;
}, (err: unknown) => {
  emit({ type: 'error', kind: 'agent', message: err instanceof Error ? err.message : String(err) });
  process.exitCode = 4;
});
