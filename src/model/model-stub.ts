// The scripted policy server: stands in for a model in the demo and the tests (no model can run
// here). It speaks the OpenAI chat-completions protocol with tool calls and answers each episode with
// the tool calls that solve its task (see stub-script.ts). Stateless per request; it only counts calls
// per (episode, turn), served at GET /_stub/calls, so tests can check no turn was asked twice.
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { rm } from 'node:fs/promises';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as delay } from 'node:timers/promises';
import type { Logger } from 'pino';
import { describeIssues } from '../config/zod-issues.ts';
import {
  BodyTooLargeError,
  CHAT_COMPLETIONS_PATH,
  ChatRequest,
  EPISODE_HEADER,
  MODELS_PATH,
  RESPONSES_PATH,
  TASK_HEADER,
  errorBody,
  parseJsonObject,
  readBody,
  sendJson,
} from './chat-protocol.ts';
import { isWrongEpisode, scriptedTurn, taskByInstruction, turnOf } from './stub-script.ts';
import { loadStubTasks, type StubTask } from './stub-tasks.ts';
import { logprobsContent, stubTokens, type StubToken, type TokenRequest } from './stub-tokens.ts';
import { StubRateLimit } from './stub-rate-limit.ts';
import { ResponsesRequest } from './responses-protocol.ts';
import { scriptedResponse, streamResponse } from './stub-responses.ts';

export const STUB_MODEL = 'scripted-policy';
export const STUB_CALLS_PATH = '/_stub/calls';
/** GET: `{ answered, rateLimited }`, chat calls past the rate limit and chat calls refused 429 by it. */
export const STUB_STATS_PATH = '/_stub/stats';
const MAX_BODY_BYTES = 16 * 1024 * 1024;
const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost']);

export interface ModelStubOptions {
  /** A task folder, or a folder of task folders; solutions are read from here, on the host. */
  tasksDir: string;
  /** Loopback TCP (port 0 picks a free one) or a Unix socket. */
  /**
   * Loopback TCP (port 0 picks a free one) or a Unix socket. `anyHost` allows another address, for a
   * stub in a container network that only the fleet's containers reach (docker-compose.yml).
   */
  listen: { port: number; host?: string | undefined; anyHost?: boolean } | { socketPath: string };
  /** Share of episodes (by a hash of the episode id) that finish without solving. @default 0 */
  wrongFraction?: number;
  /** Answer 401 unless `Authorization: Bearer <requireKey>` comes with a model call. */
  requireKey?: string | undefined;
  /** Answer 503 to the first N chat calls of each episode, to exercise a client's retries. @default 0 */
  failFirst?: number;
  /** Answer each chat call after this long, as a real model takes its time. @default 0 */
  delayMs?: number;
  /** Space the events of a streamed answer by this long (a model generating token by token). @default 0 */
  streamChunkDelayMs?: number;
  /** Refuse chat calls beyond this many a minute (bursts of one second's worth) with 429 and Retry-After. Unset: no limit. */
  rateLimitRpm?: number | undefined;
  log: Logger;
}

export interface StubCallCount {
  episodeId: string;
  taskId: string;
  turn: number;
  count: number;
}

/** Streamed answers: begun, sent to the end, and cut because the client went away. */
export interface StubStreamCounts {
  started: number;
  completed: number;
  aborted: number;
}

export interface ModelStub {
  /** The base URL to configure as MODEL_BASE_URL (TCP), e.g. http://127.0.0.1:41234/v1. */
  readonly baseUrl: string | undefined;
  readonly socketPath: string | undefined;
  readonly tasks: ReadonlyMap<string, StubTask>;
  /** Answered calls per (episode, turn), sorted (injected failures are not counted). */
  calls(): StubCallCount[];
  streams(): StubStreamCounts;
  close(): Promise<void>;
}

const shortHash = (...parts: string[]) => createHash('sha256').update(parts.join('\0')).digest('hex').slice(0, 16);

export async function startModelStub(opts: ModelStubOptions): Promise<ModelStub> {
  const wrongFraction = opts.wrongFraction ?? 0;
  if (!(wrongFraction >= 0 && wrongFraction <= 1)) {
    throw new TypeError(`Expected \`wrongFraction\` to be a number from 0 to 1, got \`${String(wrongFraction)}\` (${typeof wrongFraction})`);
  }
  if ('port' in opts.listen && !LOOPBACK.has(opts.listen.host ?? '127.0.0.1') && opts.listen.anyHost !== true) {
    throw new TypeError(`Expected \`listen.host\` to be a loopback address (or \`listen.anyHost\`), got ${JSON.stringify(opts.listen.host)}`);
  }
  const delayMs = opts.delayMs ?? 0;
  if (!Number.isInteger(delayMs) || delayMs < 0) {
    throw new TypeError(`Expected \`delayMs\` to be an integer from 0 up, got \`${String(delayMs)}\` (${typeof delayMs})`);
  }
  const failFirst = opts.failFirst ?? 0;
  if (!Number.isInteger(failFirst) || failFirst < 0) {
    throw new TypeError(`Expected \`failFirst\` to be an integer from 0 up, got \`${String(failFirst)}\` (${typeof failFirst})`);
  }
  const tasks = await loadStubTasks(opts.tasksDir);
  const log = opts.log.child({ component: 'model-stub' });
  const counts = new Map<string, StubCallCount>();
  const streams: StubStreamCounts = { started: 0, completed: 0, aborted: 0 };
  const streamChunkDelayMs = opts.streamChunkDelayMs ?? 0;
  if (!Number.isInteger(streamChunkDelayMs) || streamChunkDelayMs < 0) {
    throw new TypeError(`Expected \`streamChunkDelayMs\` to be an integer from 0 up, got \`${String(streamChunkDelayMs)}\` (${typeof streamChunkDelayMs})`);
  }
  const failuresServed = new Map<string, number>();
  const rateLimit = opts.rateLimitRpm === undefined ? undefined : new StubRateLimit(opts.rateLimitRpm);
  const stubStats = { answered: 0, rateLimited: 0 };

  async function chat(req: IncomingMessage, res: ServerResponse, body: Buffer): Promise<void> {
    if (opts.requireKey !== undefined && req.headers.authorization !== `Bearer ${opts.requireKey}`) {
      sendJson(res, 401, errorBody('unauthorized', 'missing or wrong API key in the Authorization header'));
      return;
    }
    const json = parseJsonObject(body);
    if (json === undefined) return sendJson(res, 400, errorBody('invalid_request', 'request body is not a JSON object'));
    const parsed = ChatRequest.safeParse(json);
    if (!parsed.success) return sendJson(res, 400, errorBody('invalid_request', `invalid chat request: ${describeIssues(parsed.error, json).join('; ')}`));
    const request = parsed.data;

    const header = (name: string) => {
      const v = req.headers[name];
      return typeof v === 'string' && v !== '' ? v : undefined;
    };
    const episodeId = header(EPISODE_HEADER) ?? '';
    const taskHeader = header(TASK_HEADER);
    const task = (taskHeader !== undefined ? tasks.get(taskHeader) : undefined) ?? taskByInstruction(tasks.values(), request.messages);
    if (task === undefined) {
      return sendJson(res, 400, errorBody('unknown_task', `no task ${JSON.stringify(taskHeader ?? '')} under the stub's tasks folder, and no known instruction in the messages`));
    }
    const failed = failuresServed.get(episodeId) ?? 0;
    if (failed < failFirst) {
      failuresServed.set(episodeId, failed + 1);
      return sendJson(res, 503, errorBody('internal_error', `injected failure ${failed + 1} of ${failFirst} (--fail-first)`));
    }
    const turn = turnOf(request.messages);
    const key = `${episodeId}\0${turn}`;
    const count = counts.get(key) ?? { episodeId, taskId: task.id, turn, count: 0 };
    count.count += 1;
    counts.set(key, count);

    const step = scriptedTurn(task, turn, isWrongEpisode(episodeId, wrongFraction));
    const id = shortHash(episodeId, task.id, String(turn));
    const message = step === undefined
      ? { role: 'assistant', content: 'The task is finished.' }
      : {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: `call_${turn}_${id.slice(0, 8)}`, type: 'function', function: { name: step.name, arguments: JSON.stringify(step.arguments) } }],
        };
    // The stand-in tokenizer: the prompt is the conversation and tools as JSON; the completion is the
    // text the model "generated" (the content, or the tool call's arguments).
    const promptTokens = stubTokens(JSON.stringify(request.messages) + JSON.stringify(json.tools ?? []), 'prompt');
    const call = message.tool_calls?.[0];
    const completionTokens = stubTokens(call !== undefined ? call.function.arguments : String(message.content), 'completion');
    const usage = { prompt_tokens: promptTokens.length, completion_tokens: completionTokens.length, total_tokens: promptTokens.length + completionTokens.length };
    const finishReason = step === undefined ? 'stop' : 'tool_calls';
    const head = { id: `chatcmpl-stub-${id}`, created: Math.floor(Date.now() / 1000), model: request.model ?? STUB_MODEL };
    const tokenFields = json as TokenRequest;
    const withIds = tokenFields.return_token_ids === true;
    const withLogprobs = tokenFields.logprobs === true;
    log.debug({ episodeId, taskId: task.id, turn, tool: step?.name, stream: request.stream === true }, 'scripted turn');
    if (request.stream === true) {
      return streamAnswer(res, { head, message, completionTokens, promptTokens, usage, finishReason, withIds, withLogprobs, tokenFields, includeUsage: request.stream_options?.include_usage === true });
    }
    sendJson(res, 200, {
      ...head,
      object: 'chat.completion',
      choices: [{
        index: 0,
        message,
        finish_reason: finishReason,
        ...(withLogprobs && { logprobs: { content: logprobsContent(completionTokens, tokenFields) } }),
        ...(withIds && { token_ids: completionTokens.map((t) => t.id) }),
      }],
      usage,
      ...(withIds && { prompt_token_ids: promptTokens.map((t) => t.id) }),
    });
  }

  /**
   * The same answer as Server-Sent Events, as vLLM streams it: a role chunk (with the prompt's token
   * ids when asked), one chunk per token (content, or the tool call's arguments after a chunk naming
   * it), a chunk with the finish reason, the usage chunk when asked, then [DONE]. Chunks are spaced by
   * `streamChunkDelayMs`; a client that goes away ends the stream (counted as aborted).
   */
  async function streamAnswer(res: ServerResponse, a: {
    head: Record<string, unknown>;
    message: { role: string; content: string | null; tool_calls?: { id: string; type: string; function: { name: string; arguments: string } }[] };
    completionTokens: StubToken[];
    promptTokens: StubToken[];
    usage: Record<string, number>;
    finishReason: string;
    withIds: boolean;
    withLogprobs: boolean;
    tokenFields: TokenRequest;
    includeUsage: boolean;
  }): Promise<void> {
    streams.started += 1;
    const gone = new AbortController();
    res.once('close', () => {
      if (!res.writableFinished) gone.abort();
    });
    res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
    const chunk = (choice: Record<string, unknown> | undefined, extra: Record<string, unknown> = {}) =>
      `data: ${JSON.stringify({ ...a.head, object: 'chat.completion.chunk', choices: choice === undefined ? [] : [{ index: 0, logprobs: null, finish_reason: null, ...choice }], ...extra })}\n\n`;
    const tokenParts = (t: StubToken) => ({
      ...(a.withLogprobs && { logprobs: { content: logprobsContent([t], a.tokenFields) } }),
      ...(a.withIds && { token_ids: [t.id] }),
    });
    const call = a.message.tool_calls?.[0];
    const events: string[] = [chunk({ delta: { role: 'assistant', content: call !== undefined ? null : '' } }, a.withIds ? { prompt_token_ids: a.promptTokens.map((t) => t.id) } : {})];
    if (call !== undefined) {
      events.push(chunk({ delta: { tool_calls: [{ index: 0, id: call.id, type: 'function', function: { name: call.function.name, arguments: '' } }] } }));
      for (const t of a.completionTokens) events.push(chunk({ delta: { tool_calls: [{ index: 0, function: { arguments: t.text } }] }, ...tokenParts(t) }));
    } else {
      for (const t of a.completionTokens) events.push(chunk({ delta: { content: t.text }, ...tokenParts(t) }));
    }
    events.push(chunk({ delta: {}, finish_reason: a.finishReason }));
    if (a.includeUsage) events.push(chunk(undefined, { usage: a.usage }));
    events.push('data: [DONE]\n\n');
    for (const event of events) {
      if (streamChunkDelayMs > 0 && !(await delay(streamChunkDelayMs, true, { signal: gone.signal }).catch(() => false))) break;
      if (gone.signal.aborted) break;
      res.write(event);
    }
    if (gone.signal.aborted) {
      streams.aborted += 1;
      return;
    }
    res.end();
    streams.completed += 1;
  }

  /** POST /v1/responses: the same script as Responses output items (stub-responses.ts). */
  async function responses(req: IncomingMessage, res: ServerResponse, body: Buffer): Promise<void> {
    if (opts.requireKey !== undefined && req.headers.authorization !== `Bearer ${opts.requireKey}`) {
      return sendJson(res, 401, errorBody('unauthorized', 'missing or wrong API key in the Authorization header'));
    }
    const json = parseJsonObject(body);
    if (json === undefined) return sendJson(res, 400, errorBody('invalid_request', 'request body is not a JSON object'));
    const parsed = ResponsesRequest.safeParse(json);
    if (!parsed.success) return sendJson(res, 400, errorBody('invalid_request', `invalid responses request: ${describeIssues(parsed.error, json).join('; ')}`));
    const episodeId = typeof req.headers[EPISODE_HEADER] === 'string' ? req.headers[EPISODE_HEADER] : '';
    const taskHeader = typeof req.headers[TASK_HEADER] === 'string' && req.headers[TASK_HEADER] !== '' ? req.headers[TASK_HEADER] : undefined;
    const scripted = scriptedResponse({ request: parsed.data, episodeId, taskHeader, tasks, wrongFraction, model: parsed.data.model ?? STUB_MODEL });
    if (scripted === undefined) {
      return sendJson(res, 400, errorBody('unknown_task', `no task ${JSON.stringify(taskHeader ?? '')} under the stub's tasks folder, and no known instruction in the input`));
    }
    const key = `${episodeId}\0${scripted.turn}`;
    const count = counts.get(key) ?? { episodeId, taskId: scripted.taskId, turn: scripted.turn, count: 0 };
    count.count += 1;
    counts.set(key, count);
    if (parsed.data.stream === true) {
      streams.started += 1;
      if (await streamResponse(res, scripted.response, streamChunkDelayMs)) streams.completed += 1;
      else streams.aborted += 1;
      return;
    }
    sendJson(res, 200, scripted.response);
  }

  const calls = (): StubCallCount[] =>
    [...counts.values()].map((c) => ({ ...c })).sort((a, b) => a.episodeId.localeCompare(b.episodeId) || a.turn - b.turn);

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const pathname = (req.url ?? '').split('?')[0];
    if ((pathname === CHAT_COMPLETIONS_PATH || pathname === RESPONSES_PATH) && req.method === 'POST') {
      let body: Buffer;
      try {
        body = await readBody(req, MAX_BODY_BYTES);
      } catch (err) {
        if (err instanceof BodyTooLargeError) return sendJson(res, 413, errorBody('body_too_large', err.message), { connection: 'close' });
        throw err;
      }
      // Refused before any work, as an inference server's gateway does.
      const taken = rateLimit?.take(performance.now());
      if (taken?.ok === false) {
        stubStats.rateLimited += 1;
        return sendJson(res, 429, errorBody('rate_limited', `over the stub's limit of ${opts.rateLimitRpm} requests a minute`), { 'retry-after': String(Math.ceil(taken.retryAfterMs / 1000)) });
      }
      if (delayMs > 0) {
        // The wait ends early when the client goes away, so a closing server leaves no timer behind.
        const gone = new AbortController();
        res.once('close', () => gone.abort());
        const waited = await delay(delayMs, true, { signal: gone.signal }).catch(() => false);
        if (!waited) return;
      }
      stubStats.answered += 1;
      return pathname === RESPONSES_PATH ? responses(req, res, body) : chat(req, res, body);
    }
    if (pathname === MODELS_PATH && req.method === 'GET') {
      return sendJson(res, 200, { object: 'list', data: [{ id: STUB_MODEL, object: 'model', created: 0, owned_by: 'rollout-fleet' }] });
    }
    if (pathname === STUB_CALLS_PATH && req.method === 'GET') return sendJson(res, 200, { calls: calls() });
    if (pathname === STUB_STATS_PATH && req.method === 'GET') return sendJson(res, 200, { ...stubStats, streams });
    if (pathname === CHAT_COMPLETIONS_PATH || pathname === RESPONSES_PATH || pathname === MODELS_PATH || pathname === STUB_CALLS_PATH) {
      return sendJson(res, 405, errorBody('method_not_allowed', `${pathname} does not take ${req.method}`));
    }
    return sendJson(res, 404, errorBody('not_found', `no such path ${JSON.stringify(pathname)}`));
  }

  const server = http.createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      log.error({ err }, 'model stub request failed');
      if (!res.headersSent && !res.destroyed) sendJson(res, 500, errorBody('internal_error', 'internal error of the model stub'));
    });
  });
  server.on('clientError', (_err, socket) => socket.destroy());
  if ('socketPath' in opts.listen) {
    await rm(opts.listen.socketPath, { force: true });
    server.listen(opts.listen.socketPath);
  } else {
    server.listen(opts.listen.port, opts.listen.host ?? '127.0.0.1');
  }
  await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]);
  server.on('error', (err) => log.error({ err }, 'model stub server error'));

  const address = server.address();
  const baseUrl = typeof address === 'object' && address !== null
    ? `http://${(address as AddressInfo).family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}/v1`
    : undefined;
  const socketPath = 'socketPath' in opts.listen ? opts.listen.socketPath : undefined;
  log.info({ baseUrl, socketPath, tasks: tasks.size, wrongFraction }, 'model stub listening');

  let closed: Promise<void> | undefined;
  return {
    baseUrl,
    socketPath,
    tasks,
    calls,
    streams: () => ({ ...streams }),
    close() {
      closed ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }).then(() => (socketPath !== undefined ? rm(socketPath, { force: true }) : undefined));
      return closed;
    },
  };
}
