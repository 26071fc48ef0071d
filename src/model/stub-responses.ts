// The scripted policy server's Responses API (POST /v1/responses), for tests of the gateway's relay:
// the same script as its chat completions (one tool call per turn, then a closing text), written as
// Responses output items (`function_call`, then a `message` with `output_text`), with `usage` in the
// Responses shape (`input_tokens`, `output_tokens`, `total_tokens`) from the stand-in tokenizer. The
// turn is the number of `function_call` items (and assistant messages) in the input. Streamed as the
// API streams: `event:` lines, response.created, the output item and its deltas, and a final
// response.completed carrying the whole response with its usage; no [DONE].
import { createHash } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { setTimeout as delay } from 'node:timers/promises';
import type { ChatMessage } from './chat-protocol.ts';
import type { ResponsesRequest } from './responses-protocol.ts';
import { isWrongEpisode, scriptedTurn, taskByInstruction } from './stub-script.ts';
import type { StubTask } from './stub-tasks.ts';
import { stubTokens } from './stub-tokens.ts';

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);

/** The input as chat messages, for finding the task by its instruction. */
function inputMessages(request: ResponsesRequest): ChatMessage[] {
  const items = typeof request.input === 'string' ? [{ role: 'user', content: request.input }] : request.input.filter(isObject);
  const messages = items.filter((i) => typeof i.role === 'string').map((i) => ({ role: String(i.role), content: i.content }));
  if (typeof request.instructions === 'string') messages.unshift({ role: 'system', content: request.instructions });
  return messages;
}

/** Turns already taken: function calls and assistant messages in the input. */
function responsesTurn(request: ResponsesRequest): number {
  if (typeof request.input === 'string') return 0;
  return request.input.filter((i) => isObject(i) && (i.type === 'function_call' || i.role === 'assistant')).length;
}

export interface StubResponseInput {
  request: ResponsesRequest;
  episodeId: string;
  taskHeader: string | undefined;
  tasks: ReadonlyMap<string, StubTask>;
  wrongFraction: number;
  model: string;
}

/** The scripted response object, or undefined when no task matches. */
export function scriptedResponse(a: StubResponseInput): { response: Json; turn: number; taskId: string } | undefined {
  const task = (a.taskHeader !== undefined ? a.tasks.get(a.taskHeader) : undefined) ?? taskByInstruction(a.tasks.values(), inputMessages(a.request));
  if (task === undefined) return undefined;
  const turn = responsesTurn(a.request);
  const step = scriptedTurn(task, turn, isWrongEpisode(a.episodeId, a.wrongFraction));
  const id = createHash('sha256').update([a.episodeId, task.id, String(turn)].join('\0')).digest('hex').slice(0, 16);
  const item: Json = step === undefined
    ? { type: 'message', id: `msg_${id}`, status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'The task is finished.', annotations: [] }] }
    : { type: 'function_call', id: `fc_${id}`, call_id: `call_${turn}_${id.slice(0, 8)}`, name: step.name, arguments: JSON.stringify(step.arguments), status: 'completed' };
  const input = stubTokens(JSON.stringify(a.request.input) + (a.request.instructions ?? '') + JSON.stringify(a.request.tools ?? []), 'prompt');
  const output = stubTokens(step === undefined ? 'The task is finished.' : JSON.stringify(step.arguments), 'completion');
  const response: Json = {
    id: `resp_${id}`,
    object: 'response',
    created_at: Math.floor(Date.now() / 1000),
    status: 'completed',
    model: a.model,
    output: [item],
    ...(step === undefined && { output_text: 'The task is finished.' }),
    usage: { input_tokens: input.length, output_tokens: output.length, total_tokens: input.length + output.length },
  };
  return { response, turn, taskId: task.id };
}

/** Stream `response` as the Responses API does; resolves true when sent to the end, false when the client went away. */
export async function streamResponse(res: ServerResponse, response: Json, chunkDelayMs: number): Promise<boolean> {
  const gone = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) gone.abort();
  });
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  const item = (response.output as Json[])[0]!;
  let seq = 0;
  const event = (type: string, data: Json) => `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...data })}\n\n`;
  const pending = { ...response, status: 'in_progress', output: [], usage: null };
  const events = [event('response.created', { response: pending }), event('response.in_progress', { response: pending })];
  if (item.type === 'function_call') {
    events.push(event('response.output_item.added', { output_index: 0, item: { ...item, arguments: '', status: 'in_progress' } }));
    for (const t of stubTokens(String(item.arguments), 'completion')) events.push(event('response.function_call_arguments.delta', { output_index: 0, item_id: item.id, delta: t.text }));
    events.push(event('response.function_call_arguments.done', { output_index: 0, item_id: item.id, arguments: item.arguments }));
  } else {
    const text = String(((item.content as Json[])[0] as Json).text);
    events.push(event('response.output_item.added', { output_index: 0, item: { ...item, content: [], status: 'in_progress' } }));
    for (const t of stubTokens(text, 'completion')) events.push(event('response.output_text.delta', { output_index: 0, item_id: item.id, content_index: 0, delta: t.text }));
    events.push(event('response.output_text.done', { output_index: 0, item_id: item.id, content_index: 0, text }));
  }
  events.push(event('response.output_item.done', { output_index: 0, item }));
  events.push(event('response.completed', { response }));
  for (const e of events) {
    if (chunkDelayMs > 0 && !(await delay(chunkDelayMs, true, { signal: gone.signal }).catch(() => false))) break;
    if (gone.signal.aborted) break;
    res.write(e);
  }
  if (gone.signal.aborted) return false;
  res.end();
  return true;
}
