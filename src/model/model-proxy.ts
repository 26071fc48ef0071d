// The sandbox's one way out: a per-episode HTTP server on a Unix socket (bind-mounted into the
// sandbox) that forwards only the model API to the configured endpoint, adds the API key the sandbox
// never sees, enforces the episode's call and token budgets, waits for the endpoint's fleet-wide
// limits, retries transient upstream failures, relays streamed answers event by event, and records
// every call (a stream reassembled, token ids and logprobs when the endpoint gave them) as evidence
// outside the sandbox.
import { once, setMaxListeners } from 'node:events';
import { chmod, chown, lstat, mkdir, rm } from 'node:fs/promises';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { describeIssues } from '../config/zod-issues.ts';
import { SANDBOX_USER } from '../sandbox/sandbox-session.ts';
import { CallEvidence, type CallOutcome, type ModelCallRecord } from './call-evidence.ts';
import {
  BodyTooLargeError,
  CHAT_COMPLETIONS_PATH,
  ChatRequest,
  EPISODE_HEADER,
  MODELS_PATH,
  TASK_HEADER,
  errorBody,
  estimateTokens,
  parseJsonObject,
  readBody,
  requestedMaxTokens,
  sendJson,
  usedTokens,
  type ModelErrorType,
} from './chat-protocol.ts';
import { ModelBudget, type ModelBudgetLimits } from './model-budget.ts';
import { UNLIMITED, type EndpointLimiter } from './endpoint-limiter.ts';
import { relayStream, type RelayResult } from './stream-relay.ts';
import { extractTokens, withCaptureFields } from './token-capture.ts';
import { DEFAULT_RETRY, callUpstream, release, type RetryPolicy, type UpstreamResult } from './upstream.ts';

/** File name of the call evidence in an episode attempt's evidence folder. */
export const MODEL_CALLS_FILE = 'model-calls.jsonl';

/** Where an episode's proxy socket lives on the host (and, bind-mounted, inside the sandbox). */
export function modelSocketPath(dataDir: string, episodeId: string): string {
  return path.join(dataDir, 'run', episodeId, 'model.sock');
}

// Linux limits a socket path to 108 bytes, the terminating NUL included.
const MAX_SOCKET_PATH_BYTES = 107;

export interface ModelProxyOptions {
  /** Absolute path of the socket; its folder is created (0755) and the socket made 0666 for uid 1000. */
  socketPath: string;
  /** OpenAI-compatible base URL, e.g. http://127.0.0.1:8000/v1 (MODEL_BASE_URL). */
  upstreamBaseUrl: string;
  /** Sent upstream as `Authorization: Bearer <apiKey>`; never reaches the sandbox or the evidence. */
  apiKey?: string | undefined;
  /** Model name put in every chat request; unset, the request's own `model` passes through. */
  model?: string | undefined;
  budget: ModelBudgetLimits;
  /** JSONL file that gets one line per call. */
  evidenceFile: string;
  episodeId: string;
  taskId: string;
  log: Logger;
  /** Deadline of one upstream attempt. @default 300000 */
  requestTimeoutMs?: number;
  /** Retries of connection errors, timeouts, 429 and 5xx. @default { retries: 3, baseDelayMs: 250, maxDelayMs: 5000 } */
  retry?: Partial<RetryPolicy>;
  /** Largest request body accepted; larger gets 413. @default 8388608 */
  maxBodyBytes?: number;
  /** Largest upstream answer relayed; larger gets 502 (a stream is cut with an error event). @default 33554432 */
  maxResponseBytes?: number;
  /** Longest silence of the endpoint in the middle of a stream. @default 60000, at most requestTimeoutMs */
  streamIdleTimeoutMs?: number;
  /** Ask the endpoint for token ids and logprobs (vLLM's fields) in every chat call. @default false */
  captureTokens?: boolean;
  /** The endpoint's fleet-wide limits, asked before every upstream attempt. @default UNLIMITED */
  limiter?: EndpointLimiter;
}

export interface ModelProxyStats {
  /** Calls the model answered. */
  calls: number;
  /** Tokens charged (sum of usage.total_tokens). */
  tokens: number;
  /** Requests the proxy refused itself: unknown path, wrong method, bad body, over budget. */
  refused: number;
  /** Calls that got 502 after every upstream attempt failed, and streams the endpoint broke off. */
  failed: number;
  /** Calls that got 429 because no turn of the fleet-wide limits came within the request timeout. */
  rateLimited: number;
  /** Requests being handled right now. */
  inFlight: number;
}

export interface ModelProxy {
  readonly socketPath: string;
  stats(): ModelProxyStats;
  /** Stop serving (calls in flight get 503), remove the socket, flush the evidence. Idempotent. */
  close(): Promise<void>;
}

function positiveInt(name: string, value: number): number {
  if (!Number.isInteger(value) || value < 1) throw new TypeError(`Expected \`${name}\` to be an integer from 1 up, got \`${String(value)}\` (${typeof value})`);
  return value;
}

function checkOptions(opts: ModelProxyOptions): URL {
  if (!path.isAbsolute(opts.socketPath)) throw new TypeError(`Expected \`socketPath\` to be an absolute path, got ${JSON.stringify(opts.socketPath)}`);
  const bytes = Buffer.byteLength(opts.socketPath);
  if (bytes > MAX_SOCKET_PATH_BYTES) {
    throw new TypeError(`Expected \`socketPath\` to be at most ${MAX_SOCKET_PATH_BYTES} bytes (a Unix socket limit), got ${bytes}: ${opts.socketPath}`);
  }
  let base: URL;
  try {
    base = new URL(opts.upstreamBaseUrl);
  } catch {
    throw new TypeError(`Expected \`upstreamBaseUrl\` to be a URL, got ${JSON.stringify(opts.upstreamBaseUrl)}`);
  }
  if (base.protocol !== 'http:' && base.protocol !== 'https:') {
    throw new TypeError(`Expected \`upstreamBaseUrl\` to be an http:// or https:// URL, got ${JSON.stringify(opts.upstreamBaseUrl)}`);
  }
  return base;
}

/** Refuse to take over a socket another live server still answers on; remove a stale one. */
async function clearStaleSocket(socketPath: string): Promise<void> {
  const existing = await lstat(socketPath).catch(() => undefined);
  if (existing === undefined) return;
  if (!existing.isSocket()) throw new Error(`${socketPath} exists and is not a socket`);
  const live = await new Promise<boolean>((resolve) => {
    const probe = net.connect(socketPath);
    probe.once('connect', () => {
      probe.destroy();
      resolve(true);
    });
    probe.once('error', () => resolve(false));
  });
  if (live) throw new Error(`another model proxy is listening on ${socketPath}`);
  await rm(socketPath, { force: true });
}

export async function startModelProxy(opts: ModelProxyOptions): Promise<ModelProxy> {
  const base = checkOptions(opts);
  const retry: RetryPolicy = { ...DEFAULT_RETRY, ...opts.retry };
  const requestTimeoutMs = positiveInt('requestTimeoutMs', opts.requestTimeoutMs ?? 300_000);
  const maxBodyBytes = positiveInt('maxBodyBytes', opts.maxBodyBytes ?? 8 * 1024 * 1024);
  const maxResponseBytes = positiveInt('maxResponseBytes', opts.maxResponseBytes ?? 32 * 1024 * 1024);
  const streamIdleTimeoutMs = positiveInt('streamIdleTimeoutMs', opts.streamIdleTimeoutMs ?? Math.min(60_000, requestTimeoutMs));
  const limiter = opts.limiter ?? UNLIMITED;
  const budget = new ModelBudget(opts.budget);
  const { socketPath, episodeId, taskId } = opts;
  const log = opts.log.child({ episodeId, taskId, component: 'model-proxy' });

  const socketDir = path.dirname(socketPath);
  await mkdir(socketDir, { recursive: true, mode: 0o755 });
  await chmod(socketDir, 0o755);
  await clearStaleSocket(socketPath);
  const evidence = await CallEvidence.open(opts.evidenceFile, [opts.apiKey]);

  const closing = new AbortController();
  // Every call in flight listens to it (as many as the agent sends at once).
  setMaxListeners(0, closing.signal);
  const inFlight = new Set<Promise<void>>();
  let seq = 0;
  let refused = 0;
  let failed = 0;
  let rateLimited = 0;

  const upstreamHeaders = (): Record<string, string> => ({
    accept: 'application/json',
    [EPISODE_HEADER]: episodeId,
    [TASK_HEADER]: taskId,
    ...(opts.apiKey !== undefined ? { authorization: `Bearer ${opts.apiKey}` } : {}),
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const started = performance.now();
    const record: ModelCallRecord = {
      seq: ++seq,
      episodeId,
      taskId,
      startedAt: new Date().toISOString(),
      durationMs: 0,
      method: req.method ?? '',
      path: (req.url ?? '').split('?')[0] ?? '',
      status: 0,
      outcome: 'refused',
    };

    const finish = async (outcome: CallOutcome, status: number, body: unknown, headers: Record<string, string> = {}, raw?: { contentType: string | undefined; body: Buffer }) => {
      record.outcome = outcome;
      record.status = res.destroyed && !res.writableFinished ? 0 : status;
      record.durationMs = Math.round(performance.now() - started);
      try {
        await evidence.append(record);
      } catch (err) {
        log.error({ err, seq: record.seq }, 'model call evidence not written');
      }
      log.debug({ seq: record.seq, path: record.path, status: record.status, outcome, durationMs: record.durationMs, tokens: record.tokens }, 'model call');
      if (res.destroyed || res.headersSent) return;
      if (raw !== undefined) {
        res.writeHead(status, { 'content-type': raw.contentType ?? 'application/json', 'content-length': raw.body.length, ...headers });
        res.end(raw.body);
      } else {
        sendJson(res, status, body, headers);
      }
    };

    const refuse = (status: number, type: ModelErrorType, message: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}) => {
      refused += 1;
      record.error = { type, message };
      return finish('refused', status, errorBody(type, message, extra), headers);
    };

    if (closing.signal.aborted) return finish('aborted', 503, errorBody('proxy_closing', 'the model proxy is closing'));
    const route = record.path === CHAT_COMPLETIONS_PATH ? 'POST' : record.path === MODELS_PATH ? 'GET' : undefined;
    if (route === undefined) {
      return refuse(404, 'not_found', `no such path ${JSON.stringify(record.path)}: the model proxy serves only POST ${CHAT_COMPLETIONS_PATH} and GET ${MODELS_PATH}`);
    }
    if (req.method !== route) {
      return refuse(405, 'method_not_allowed', `${record.path} takes ${route}, not ${req.method}`, {}, { allow: route });
    }

    let upstreamBody: Buffer | undefined;
    let maxTokens: number | undefined;
    let streaming = false;
    let forwardUsageChunk = false;
    if (route === 'POST') {
      let body: Buffer;
      try {
        body = await readBody(req, maxBodyBytes);
      } catch (err) {
        if (err instanceof BodyTooLargeError) {
          return refuse(413, 'body_too_large', `request body is larger than ${maxBodyBytes} bytes`, { limitBytes: maxBodyBytes }, { connection: 'close' });
        }
        // The client went away while sending; nobody is left to answer, but the call is recorded.
        record.error = { type: 'invalid_request', message: `request body not received: ${(err as Error).message}` };
        return finish('aborted', 400, errorBody('invalid_request', record.error.message));
      }
      const json = parseJsonObject(body);
      record.request = json ?? { notJson: true, bytes: body.length };
      if (json === undefined) return refuse(400, 'invalid_request', 'request body is not a JSON object');
      const parsed = ChatRequest.safeParse(json);
      if (!parsed.success) return refuse(400, 'invalid_request', `invalid chat request: ${describeIssues(parsed.error, json).join('; ')}`);
      streaming = parsed.data.stream === true;
      if (streaming && (parsed.data.n ?? 1) > 1) {
        return refuse(400, 'invalid_request', `n is ${parsed.data.n}: a streamed call (stream: true) must ask for one choice; send n: 1 or stream: false`, { param: 'n' });
      }
      let forwarded: Record<string, unknown> = opts.model !== undefined ? { ...json, model: opts.model } : json;
      if (opts.captureTokens === true) forwarded = withCaptureFields(forwarded);
      if (streaming) {
        // Usage comes only in a last chunk the agent may not have asked for: asked upstream, kept from the agent.
        forwardUsageChunk = parsed.data.stream_options?.include_usage === true;
        forwarded = { ...forwarded, stream_options: { ...parsed.data.stream_options, include_usage: true } };
      }
      upstreamBody = Buffer.from(JSON.stringify(forwarded));
      maxTokens = requestedMaxTokens(parsed.data);
    }

    // Only chat calls spend the budget; listing models is free.
    const admission = route === 'POST' ? budget.admit(maxTokens, estimateTokens(upstreamBody!.toString('utf8'))) : undefined;
    if (admission !== undefined && !admission.ok) {
      const { budget: which, limit, used, message } = admission.refusal;
      return refuse(429, 'budget_exceeded', message, { budget: which, limit, used });
    }
    const ticket = admission?.ticket;

    const call = new AbortController();
    const abortCall = () => call.abort();
    closing.signal.addEventListener('abort', abortCall, { once: true });
    res.once('close', () => {
      if (!res.writableFinished) abortCall();
    });
    let result: UpstreamResult;
    // A stream still flowing keeps listening for the proxy's close until the relay ends; nothing else does.
    let live = false;
    try {
      result = await callUpstream(
        base,
        {
          method: route,
          path: route === 'POST' ? '/chat/completions' : '/models',
          headers: { ...upstreamHeaders(), ...(upstreamBody !== undefined ? { 'content-type': 'application/json' } : {}) },
          ...(upstreamBody !== undefined ? { body: upstreamBody } : {}),
        },
        { timeoutMs: requestTimeoutMs, retry, maxResponseBytes, signal: call.signal, stream: streaming, limiter },
      );
      live = result.ok && 'stream' in result;
    } catch (err) {
      if (ticket !== undefined) budget.settle(ticket, { answered: false });
      if (!call.signal.aborted) throw err;
      record.error = { type: 'proxy_closing', message: closing.signal.aborted ? 'the model proxy closed during the call' : 'the client went away during the call' };
      return finish('aborted', 503, errorBody('proxy_closing', record.error.message));
    } finally {
      if (!live) closing.signal.removeEventListener('abort', abortCall);
    }

    record.attempts = result.attempts;
    if (!result.ok && result.rateLimited === true) {
      if (ticket !== undefined) budget.settle(ticket, { answered: false });
      rateLimited += 1;
      record.error = { type: 'rate_limited', message: result.message };
      return finish('refused', 429, errorBody('rate_limited', result.message), { 'retry-after': '1' });
    }
    if (!result.ok) {
      if (ticket !== undefined) budget.settle(ticket, { answered: false });
      failed += 1;
      record.error = { type: 'upstream_failed', message: result.message };
      log.warn({ seq: record.seq, attempts: result.attempts.length, lastStatus: result.lastStatus }, 'model endpoint failed');
      return finish('upstream_failed', 502, errorBody('upstream_failed', result.message, {
        attempts: result.attempts.length,
        ...(result.lastStatus !== undefined ? { upstreamStatus: result.lastStatus } : {}),
      }));
    }
    if ('stream' in result) {
      let relay: RelayResult;
      try {
        relay = await relayStream(result.stream, res, { idleTimeoutMs: streamIdleTimeoutMs, maxBytes: maxResponseBytes, forwardUsageChunk, signal: closing.signal });
      } finally {
        closing.signal.removeEventListener('abort', abortCall);
      }
      const tokens = usedTokens(relay.completion) ?? estimateTokens(upstreamBody!.toString('utf8')) + estimateTokens(JSON.stringify(relay.completion.choices ?? []));
      release(result.permit, { status: result.status, tokens });
      record.response = relay.completion;
      record.stream = { events: relay.events, bytes: relay.bytes, ...(relay.firstEventMs !== undefined && { firstEventMs: relay.firstEventMs }) };
      const captured = extractTokens(relay.completion);
      if (captured !== undefined) record.capture = captured;
      if (ticket !== undefined) {
        // What streamed before a failure was generated, so it is charged; only a call with nothing is given back.
        const answered = relay.outcome === 'answered' || relay.events > 0;
        budget.settle(ticket, { answered, tokens });
        if (answered) record.tokens = tokens;
      }
      if (relay.error !== undefined) record.error = relay.error;
      if (relay.outcome === 'upstream_failed') {
        failed += 1;
        log.warn({ seq: record.seq, err: relay.error?.message }, 'model stream failed');
      }
      return finish(relay.outcome, relay.outcome === 'aborted' ? 0 : 200, undefined);
    }
    const answer = parseJsonObject(result.body);
    record.response = answer ?? result.body.toString('utf8');
    const tokens = answer !== undefined ? (usedTokens(answer) ?? 0) : 0;
    release(result.permit, { status: result.status, tokens });
    const captured = answer !== undefined ? extractTokens(answer) : undefined;
    if (captured !== undefined) record.capture = captured;
    if (ticket !== undefined) {
      budget.settle(ticket, { answered: true, tokens });
      record.tokens = tokens;
    }
    return finish('answered', result.status, undefined, {}, { contentType: result.contentType, body: result.body });
  }

  const server = http.createServer((req, res) => {
    const done = handle(req, res)
      .catch((err: unknown) => {
        log.error({ err }, 'model proxy request failed');
        if (!res.headersSent && !res.destroyed) sendJson(res, 500, errorBody('internal_error', 'internal error of the model proxy'));
      })
      .finally(() => inFlight.delete(done));
    inFlight.add(done);
  });
  server.on('clientError', (_err, socket) => socket.destroy());
  server.listen(socketPath);
  await Promise.race([once(server, 'listening'), once(server, 'error').then(([err]) => Promise.reject(err as Error))]).catch(async (err: unknown) => {
    await evidence.close();
    throw err;
  });
  server.on('error', (err) => log.error({ err }, 'model proxy server error'));
  // Only the sandbox user may connect: a worker running as root hands the socket to uid 1000 (0600);
  // otherwise it cannot chown, and the socket is left open to all local users (0666).
  if (process.getuid?.() === 0) {
    await chown(socketPath, SANDBOX_USER.uid, SANDBOX_USER.gid);
    await chmod(socketPath, 0o600);
  } else {
    await chmod(socketPath, 0o666);
  }
  log.info({ socketPath, upstream: base.origin, maxCalls: budget.limits.maxCalls, maxTokens: budget.limits.maxTokens }, 'model proxy started');

  let closed: Promise<void> | undefined;
  const stats = (): ModelProxyStats => ({ calls: budget.calls, tokens: budget.tokens, refused, failed, rateLimited, inFlight: inFlight.size });
  return {
    socketPath,
    stats,
    close() {
      closed ??= (async () => {
        closing.abort();
        const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
        await Promise.allSettled([...inFlight]);
        server.closeAllConnections();
        await stopped;
        await rm(socketPath, { force: true });
        await evidence.close();
        log.info(stats(), 'model proxy closed');
      })();
      return closed;
    },
  };
}
