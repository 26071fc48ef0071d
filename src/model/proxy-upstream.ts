// The one way a proxied call reaches the model endpoint, shared by every route: the API key and the
// episode's headers added, a turn of the endpoint's fleet-wide limits before each attempt, retries of
// transient failures, a deadline per attempt, and an abort when the client goes away or the proxy
// closes. A call that gets no answer is ended here (503, 429 or 502); the route gets only answers.
import type { EndpointLimiter } from './endpoint-limiter.ts';
import type { ProxyCall } from './proxy-call.ts';
import { callUpstream, release, type RetryPolicy, type UpstreamResult } from './upstream.ts';

/** How this proxy's calls go upstream, compiled once from its options. */
export interface UpstreamSettings {
  /** The endpoint's OpenAI-compatible base URL. */
  base: URL;
  /** Sent with every call: the episode's ids, and the API key the sandbox never sees. */
  headers: Record<string, string>;
  /** Deadline of one attempt (a streamed answer included), and of one wait for a turn of the limits. */
  timeoutMs: number;
  retry: RetryPolicy;
  maxResponseBytes: number;
  limiter: EndpointLimiter;
  /** Aborts when the proxy closes: every call in flight ends. */
  closing: AbortSignal;
}

export interface UpstreamCall {
  method: 'GET' | 'POST';
  /** Path below the base URL, e.g. `/chat/completions`. */
  path: string;
  /** A JSON body. */
  body?: Buffer;
  /** Hand back a streamed answer as it flows (a chat call with `stream: true`). */
  stream: boolean;
}

/** An answer of the endpoint (any status but the retried ones), whole or still streaming. */
export interface Forwarded {
  answer: Extract<UpstreamResult, { ok: true }>;
  /** End the answer's turn of the fleet-wide limits, reporting the tokens it used. */
  release(tokens: number): void;
  /** Stop ending the call when the proxy closes: call it once a streamed answer's relay is over. */
  detach(): void;
}

/**
 * Send `request` upstream for `call`. Resolves with the answer, or undefined when the call has already
 * been ended here without one; `giveBack` runs first in that case (the route's budget reservation is
 * returned before the client hears, so its next call sees the room). Throws only what is not the
 * call's to survive (a bug), after `giveBack`.
 */
export async function forwardUpstream(call: ProxyCall, upstream: UpstreamSettings, request: UpstreamCall, giveBack: () => void): Promise<Forwarded | undefined> {
  const { res } = call;
  const ctrl = new AbortController();
  const abortCall = () => ctrl.abort();
  const detach = () => upstream.closing.removeEventListener('abort', abortCall);
  upstream.closing.addEventListener('abort', abortCall, { once: true });
  // A client that hangs up before its answer is complete ends the upstream call (and frees its turn).
  res.once('close', () => {
    if (!res.writableFinished) abortCall();
  });
  let result: UpstreamResult;
  // A stream still flowing keeps listening for the proxy's close until the relay ends; nothing else does.
  let live = false;
  try {
    result = await callUpstream(
      upstream.base,
      {
        method: request.method,
        path: request.path,
        headers: { ...upstream.headers, ...(request.body !== undefined ? { 'content-type': 'application/json' } : {}) },
        ...(request.body !== undefined ? { body: request.body } : {}),
      },
      { timeoutMs: upstream.timeoutMs, retry: upstream.retry, maxResponseBytes: upstream.maxResponseBytes, signal: ctrl.signal, stream: request.stream, limiter: upstream.limiter },
    );
    live = result.ok && 'stream' in result;
  } catch (err) {
    giveBack();
    if (!ctrl.signal.aborted) throw err;
    await call.abort(503, 'proxy_closing', upstream.closing.aborted ? 'the model proxy closed during the call' : 'the client went away during the call');
    return undefined;
  } finally {
    if (!live) detach();
  }

  call.attempts = result.attempts;
  if (!result.ok) {
    giveBack();
    await (result.rateLimited === true ? call.rateLimited(result.message) : call.upstreamFailed(result));
    return undefined;
  }
  const answer = result;
  return { answer, release: (tokens) => release(answer.permit, { status: answer.status, tokens }), detach };
}
