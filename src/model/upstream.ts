// One model call to the upstream endpoint, retried with exponential backoff (and jitter) on connection
// errors, timeouts, 429 and 5xx. Every attempt is reported, so the evidence shows what happened.
import http, { type IncomingMessage } from 'node:http';
import https from 'node:https';
import { setTimeout as delay } from 'node:timers/promises';
import { RateLimitWaitAborted, UNLIMITED, type AttemptOutcome, type EndpointLimiter, type EndpointPermit } from './endpoint-limiter.ts';

export interface RetryPolicy {
  /** Further attempts after the first. @default 3 */
  retries: number;
  /** Wait before the first retry; doubles with every retry. @default 250 */
  baseDelayMs: number;
  /** Longest wait between attempts (a Retry-After header is honoured up to this). @default 5000 */
  maxDelayMs: number;
}

export const DEFAULT_RETRY: RetryPolicy = { retries: 3, baseDelayMs: 250, maxDelayMs: 5_000 };

export interface UpstreamRequest {
  method: 'GET' | 'POST';
  /** Path below the base URL, e.g. `/chat/completions`. */
  path: string;
  headers: Record<string, string>;
  body?: Buffer;
}

export interface UpstreamOptions {
  /** Deadline of one attempt (a streamed answer included). */
  timeoutMs: number;
  retry: RetryPolicy;
  /** A larger answer fails the call (it is not retried). Streamed answers are relayed, not held. */
  maxResponseBytes: number;
  /** Aborts the call and its backoff (the client went away or the proxy is closing). */
  signal: AbortSignal;
  /** Hand back a 200 text/event-stream answer as a live stream instead of reading it whole. */
  stream?: boolean;
  /** The endpoint's fleet-wide limits, asked before every attempt. @default UNLIMITED */
  limiter?: EndpointLimiter;
}

export interface UpstreamAttempt {
  status?: number;
  error?: string;
  durationMs: number;
  /** Time waited for a turn of the fleet-wide limits before the attempt. */
  waitedMs?: number;
}

interface Answered {
  ok: true;
  status: number;
  contentType: string | undefined;
  attempts: UpstreamAttempt[];
  /** The attempt's turn of the fleet-wide limits: release it (with the tokens used) once the answer is read. */
  permit: EndpointPermit;
}

export type UpstreamResult =
  | (Answered & { body: Buffer })
  /** A streamed answer, still flowing: read it, then release the permit. Aborting the call's signal ends it. */
  | (Answered & { stream: IncomingMessage })
  | { ok: false; message: string; lastStatus?: number; attempts: UpstreamAttempt[]; rateLimited?: boolean };

interface AttemptAnswer {
  status: number;
  contentType: string | undefined;
  retryAfterMs: number | undefined;
  body?: Buffer;
  stream?: IncomingMessage;
}

class ResponseTooLargeError extends Error {}

function retryAfterMs(value: string | undefined): number | undefined {
  if (value === undefined) return undefined;
  const seconds = Number(value);
  return Number.isFinite(seconds) && seconds >= 0 ? seconds * 1000 : undefined;
}

/** `base` + `path`, keeping the base's own path (`http://h/v1` + `/models` = `http://h/v1/models`). */
export function upstreamUrl(base: URL, path: string): URL {
  const url = new URL(base.href);
  url.pathname = `${url.pathname.replace(/\/+$/, '')}${path}`;
  return url;
}

const isEventStream = (contentType: string | undefined) => contentType?.split(';')[0]?.trim().toLowerCase() === 'text/event-stream';

function attemptOnce(url: URL, req: UpstreamRequest, opts: UpstreamOptions): Promise<AttemptAnswer> {
  const signal = AbortSignal.any([opts.signal, AbortSignal.timeout(opts.timeoutMs)]);
  const send = url.protocol === 'https:' ? https.request : http.request;
  return new Promise<AttemptAnswer>((resolve, reject) => {
    const headers: Record<string, string | number> = { ...req.headers };
    if (req.body !== undefined) headers['content-length'] = req.body.length;
    const outgoing = send(url, { method: req.method, headers, signal }, (res) => {
      const answer = {
        status: res.statusCode ?? 0,
        contentType: res.headers['content-type'],
        retryAfterMs: retryAfterMs(res.headers['retry-after'] as string | undefined),
      };
      if (opts.stream === true && answer.status === 200 && isEventStream(answer.contentType)) {
        resolve({ ...answer, stream: res });
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > opts.maxResponseBytes) {
          res.destroy(new ResponseTooLargeError(`upstream answer is larger than ${opts.maxResponseBytes} bytes`));
          return;
        }
        chunks.push(chunk);
      });
      res.once('error', reject);
      res.once('end', () => resolve({ ...answer, body: Buffer.concat(chunks) }));
    });
    outgoing.once('error', (err) => reject(signal.aborted && !opts.signal.aborted ? new Error(`no answer within ${opts.timeoutMs} ms`) : err));
    outgoing.end(req.body);
  });
}

/** Report an attempt to the limits without waiting: a slow Redis must not hold the answer (a lease expires by itself). */
export function release(permit: EndpointPermit, outcome: AttemptOutcome): void {
  permit.release(outcome).catch(() => undefined);
}

const describe = (err: unknown): string => {
  const e = err as NodeJS.ErrnoException;
  return e.code !== undefined ? `${e.code}: ${e.message}` : String(e.message ?? err);
};

/**
 * Send a request upstream, retrying transient failures; never throws (but for the caller's abort).
 * Each attempt waits for a turn of the endpoint's fleet-wide limits first, at most `timeoutMs`
 * (then the call ends `rateLimited`), and reports its outcome to them.
 */
export async function callUpstream(base: URL, req: UpstreamRequest, opts: UpstreamOptions): Promise<UpstreamResult> {
  const url = upstreamUrl(base, req.path);
  const limiter = opts.limiter ?? UNLIMITED;
  const attempts: UpstreamAttempt[] = [];
  let lastStatus: number | undefined;
  let lastMessage = '';
  for (let n = 0; n <= opts.retry.retries; n++) {
    const waitStarted = performance.now();
    let permit: EndpointPermit;
    try {
      permit = await limiter.acquire(AbortSignal.any([opts.signal, AbortSignal.timeout(opts.timeoutMs)]));
    } catch (err) {
      opts.signal.throwIfAborted();
      // No turn in time, or the limits' Redis failing: the call is not sent (the endpoint is not
      // hammered unmetered); the agent gets 429 and may try again.
      const message = err instanceof RateLimitWaitAborted ? err.message : `the fleet-wide limits of the model endpoint are unavailable: ${describe(err)}`;
      return { ok: false, rateLimited: true, message, attempts, ...(lastStatus !== undefined ? { lastStatus } : {}) };
    }
    const started = performance.now();
    const waitedMs = Math.round(started - waitStarted);
    let waitHintMs: number | undefined;
    try {
      const answer = await attemptOnce(url, req, opts);
      const durationMs = Math.round(performance.now() - started);
      attempts.push({ status: answer.status, durationMs, ...(waitedMs > 0 && { waitedMs }) });
      if (answer.status < 500 && answer.status !== 429) {
        const answered = { ok: true as const, status: answer.status, contentType: answer.contentType, attempts, permit };
        return answer.stream !== undefined ? { ...answered, stream: answer.stream } : { ...answered, body: answer.body ?? Buffer.alloc(0) };
      }
      release(permit, { status: answer.status, retryAfterMs: answer.retryAfterMs });
      lastStatus = answer.status;
      lastMessage = `upstream answered ${answer.status}`;
      waitHintMs = answer.retryAfterMs;
    } catch (err) {
      release(permit, {});
      opts.signal.throwIfAborted();
      attempts.push({ error: describe(err), durationMs: Math.round(performance.now() - started), ...(waitedMs > 0 && { waitedMs }) });
      lastMessage = describe(err);
      if (err instanceof ResponseTooLargeError) return { ok: false, message: lastMessage, attempts };
    }
    if (n < opts.retry.retries) {
      const backoff = Math.min(opts.retry.maxDelayMs, opts.retry.baseDelayMs * 2 ** n) * (0.5 + Math.random() / 2);
      await delay(Math.min(opts.retry.maxDelayMs, Math.max(backoff, waitHintMs ?? 0)), undefined, { signal: opts.signal });
    }
  }
  return {
    ok: false,
    message: `model endpoint failed after ${attempts.length} attempts: ${lastMessage}`,
    ...(lastStatus !== undefined ? { lastStatus } : {}),
    attempts,
  };
}
