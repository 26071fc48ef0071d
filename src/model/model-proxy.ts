// The sandbox's one way out: a per-episode HTTP server on a Unix socket (bind-mounted into the
// sandbox) that forwards only the model API to the configured endpoint, adds the API key the sandbox
// never sees, enforces the episode's call and token budgets, waits for the endpoint's fleet-wide
// limits, retries transient upstream failures, relays streamed answers event by event, and records
// every call (a stream reassembled, token ids and logprobs when the endpoint gave them) as evidence
// outside the sandbox. This file starts and stops the server and routes each request: the routes are
// chat-route.ts and models-route.ts, their shared way upstream proxy-upstream.ts, and each call's
// evidence proxy-call.ts.
import { once, setMaxListeners } from 'node:events';
import { chmod, chown, lstat, mkdir, rm } from 'node:fs/promises';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import net from 'node:net';
import path from 'node:path';
import type { Logger } from 'pino';
import { SANDBOX_USER } from '../sandbox/sandbox-session.ts';
import { CallEvidence } from './call-evidence.ts';
import { CHAT_COMPLETIONS_PATH, EPISODE_HEADER, MODELS_PATH, RESPONSES_PATH, TASK_HEADER, errorBody, sendJson } from './chat-protocol.ts';
import { handleChat, type ChatRouteSettings } from './chat-route.ts';
import { ModelBudget, type ModelBudgetLimits } from './model-budget.ts';
import { handleModels } from './models-route.ts';
import type { EpisodePolicy, PolicyStamp } from './policy-versions.ts';
import { handleResponses } from './responses-route.ts';
import { UNLIMITED, type EndpointLimiter } from './endpoint-limiter.ts';
import { ProxyCall, type CallCounters, type CallLedger } from './proxy-call.ts';
import type { UpstreamSettings } from './proxy-upstream.ts';
import { DEFAULT_RETRY, type RetryPolicy } from './upstream.ts';

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
  /** Model name put in a request that names none (the batch's or endpoint's, as the sandbox is told). */
  defaultModel?: string | undefined;
  /** The batch's sampling parameters: filled into requests that omit them, or overwriting them with `enforceSampling`. */
  sampling?: Readonly<Record<string, unknown>> | undefined;
  enforceSampling?: boolean | undefined;
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
  /** Stamps every model call with the endpoint's policy version at its start, and checks staleness. @default none */
  policy?: EpisodePolicy;
  /** A call was refused because it would take the episode past its batch's maxStaleness (409 policy_stale). */
  onStale?: (stamp: PolicyStamp) => void;
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

/** The tokens of the proxy's calls: the usage its answers reported, totalled as the budget charged them. */
export interface ModelProxyUsage {
  promptTokens: number;
  completionTokens: number;
  totalTokens: number;
}

export interface ModelProxy {
  readonly socketPath: string;
  /** The model the episode plays (defaultModel), as the sandbox is told; undefined when none is named. */
  readonly model: string | undefined;
  stats(): ModelProxyStats;
  /** Sums of usage.prompt_tokens and usage.completion_tokens of the answers charged; total = stats().tokens. */
  usage(): ModelProxyUsage;
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

/** The one method each path the proxy serves takes; undefined for any other path. */
function routeMethod(callPath: string): 'POST' | 'GET' | undefined {
  return callPath === CHAT_COMPLETIONS_PATH || callPath === RESPONSES_PATH ? 'POST' : callPath === MODELS_PATH ? 'GET' : undefined;
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

  const counters: CallCounters = { refused: 0, failed: 0, rateLimited: 0, promptTokens: 0, completionTokens: 0 };
  let seq = 0;
  const ledger: CallLedger = { evidence, log, counters, episodeId, taskId, nextSeq: () => ++seq };
  const upstream: UpstreamSettings = {
    base,
    headers: {
      accept: 'application/json',
      [EPISODE_HEADER]: episodeId,
      [TASK_HEADER]: taskId,
      ...(opts.apiKey !== undefined ? { authorization: `Bearer ${opts.apiKey}` } : {}),
    },
    timeoutMs: requestTimeoutMs,
    retry,
    maxResponseBytes,
    limiter,
    closing: closing.signal,
  };
  const chat: ChatRouteSettings = { upstream, budget, maxBodyBytes, streamIdleTimeoutMs, overrides: { forceModel: opts.model, defaultModel: opts.defaultModel, sampling: opts.sampling, enforce: opts.enforceSampling }, captureTokens: opts.captureTokens === true };

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const call = new ProxyCall(ledger, req, res);
    if (closing.signal.aborted) return call.finish('aborted', 503, errorBody('proxy_closing', 'the model proxy is closing'));
    const { path: callPath } = call.record;
    const method = routeMethod(callPath);
    if (method === undefined) {
      return call.refuse(404, 'not_found', `no such path ${JSON.stringify(callPath)}: the model proxy serves only POST ${CHAT_COMPLETIONS_PATH}, POST ${RESPONSES_PATH} and GET ${MODELS_PATH}`);
    }
    if (req.method !== method) {
      return call.refuse(405, 'method_not_allowed', `${callPath} takes ${method}, not ${req.method}`, {}, { allow: method });
    }
    if (method === 'GET') return handleModels(call, upstream);
    // A model call is stamped with the policy version current at its start, before its body is read.
    const stamp = await opts.policy?.stamp();
    if (stamp !== undefined) {
      call.record.policyVersion = stamp.version;
      if (stamp.source === 'cache') call.record.policyVersionSource = 'cache';
      if (stamp.stale) {
        req.resume();
        opts.onStale?.(stamp);
        return call.refuse(409, 'policy_stale', `policy version ${stamp.version} is ${stamp.version - stamp.first} versions past this episode's first (${stamp.first}), more than its batch's maxStaleness: the episode restarts from scratch`, { policyVersion: stamp.version, firstVersion: stamp.first });
      }
    }
    return callPath === RESPONSES_PATH ? handleResponses(call, chat) : handleChat(call, chat);
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
  const stats = (): ModelProxyStats => ({
    calls: budget.calls, tokens: budget.tokens, refused: counters.refused, failed: counters.failed, rateLimited: counters.rateLimited, inFlight: inFlight.size,
  });
  return {
    socketPath,
    model: opts.defaultModel ?? opts.model,
    stats,
    usage: () => ({ promptTokens: counters.promptTokens, completionTokens: counters.completionTokens, totalTokens: budget.tokens }),
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
