// One model call to the upstream endpoint, retried with exponential backoff (and jitter) on connection
// errors, timeouts, 429 and 5xx. Every attempt is reported, so the evidence shows what happened.
import http from 'node:http';
import https from 'node:https';
import { setTimeout as delay } from 'node:timers/promises';

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
  /** Deadline of one attempt. */
  timeoutMs: number;
  retry: RetryPolicy;
  /** A larger answer fails the call (it is not retried). */
  maxResponseBytes: number;
  /** Aborts the call and its backoff (the client went away or the proxy is closing). */
  signal: AbortSignal;
}

export interface UpstreamAttempt {
  status?: number;
  error?: string;
  durationMs: number;
}

export type UpstreamResult =
  | { ok: true; status: number; contentType: string | undefined; body: Buffer; attempts: UpstreamAttempt[] }
  | { ok: false; message: string; lastStatus?: number; attempts: UpstreamAttempt[] };

interface AttemptAnswer {
  status: number;
  contentType: string | undefined;
  retryAfterMs: number | undefined;
  body: Buffer;
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

function attemptOnce(url: URL, req: UpstreamRequest, opts: UpstreamOptions): Promise<AttemptAnswer> {
  const signal = AbortSignal.any([opts.signal, AbortSignal.timeout(opts.timeoutMs)]);
  const send = url.protocol === 'https:' ? https.request : http.request;
  return new Promise<AttemptAnswer>((resolve, reject) => {
    const headers: Record<string, string | number> = { ...req.headers };
    if (req.body !== undefined) headers['content-length'] = req.body.length;
    const outgoing = send(url, { method: req.method, headers, signal }, (res) => {
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
      res.once('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          contentType: res.headers['content-type'],
          retryAfterMs: retryAfterMs(res.headers['retry-after'] as string | undefined),
          body: Buffer.concat(chunks),
        }),
      );
    });
    outgoing.once('error', (err) => reject(signal.aborted && !opts.signal.aborted ? new Error(`no answer within ${opts.timeoutMs} ms`) : err));
    outgoing.end(req.body);
  });
}

const describe = (err: unknown): string => {
  const e = err as NodeJS.ErrnoException;
  return e.code !== undefined ? `${e.code}: ${e.message}` : String(e.message ?? err);
};

/** Send a request upstream, retrying transient failures; never throws (but for the caller's abort). */
export async function callUpstream(base: URL, req: UpstreamRequest, opts: UpstreamOptions): Promise<UpstreamResult> {
  const url = upstreamUrl(base, req.path);
  const attempts: UpstreamAttempt[] = [];
  let lastStatus: number | undefined;
  let lastMessage = '';
  for (let n = 0; n <= opts.retry.retries; n++) {
    const started = performance.now();
    let waitHintMs: number | undefined;
    try {
      const answer = await attemptOnce(url, req, opts);
      const durationMs = Math.round(performance.now() - started);
      attempts.push({ status: answer.status, durationMs });
      if (answer.status < 500 && answer.status !== 429) {
        return { ok: true, status: answer.status, contentType: answer.contentType, body: answer.body, attempts };
      }
      lastStatus = answer.status;
      lastMessage = `upstream answered ${answer.status}`;
      waitHintMs = answer.retryAfterMs;
    } catch (err) {
      opts.signal.throwIfAborted();
      attempts.push({ error: describe(err), durationMs: Math.round(performance.now() - started) });
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
