// Relays a streamed chat completion from the endpoint to the agent event by event, as it comes (never
// the whole answer held first), while reassembling it for the evidence. An upstream that stalls
// between events, sends what is not an OpenAI chunk, or ends without `[DONE]` ends the stream with an
// error event the agent's client raises; an agent that goes away aborts the upstream call.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ModelErrorType } from './chat-protocol.ts';
import { SSE_DONE, SseParser, formatSse, type SseEvent } from './sse.ts';
import { StreamAssembler } from './stream-assembly.ts';

export interface RelayOptions {
  /** Longest silence between two upstream events. */
  idleTimeoutMs: number;
  /** A stream larger than this is cut with an error. */
  maxBytes: number;
  /** Whether the agent asked for the usage chunk (`stream_options.include_usage`); if not, it is not sent on. */
  forwardUsageChunk: boolean;
  /** Aborted when the call must end (the proxy closes): the relay ends with an error event. */
  signal: AbortSignal;
}

export interface RelayResult {
  outcome: 'answered' | 'upstream_failed' | 'aborted';
  /** Why the stream did not end with `[DONE]`. */
  error?: { type: ModelErrorType; message: string };
  /** The chat.completion the events added up to (what arrived, when cut). */
  completion: Record<string, unknown>;
  /** Events relayed to the agent. */
  events: number;
  /** Time from the relay's start to the first event with content (ms). */
  firstEventMs?: number;
  bytes: number;
}

export function relayStream(upstream: IncomingMessage, res: ServerResponse, opts: RelayOptions): Promise<RelayResult> {
  const started = performance.now();
  const parser = new SseParser();
  const assembler = new StreamAssembler();
  let events = 0;
  let bytes = 0;
  let firstEventMs: number | undefined;
  let sawDone = false;

  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
  res.flushHeaders();

  return new Promise<RelayResult>((resolve) => {
    let settled = false;
    let idle: NodeJS.Timeout | undefined;
    const settle = (outcome: RelayResult['outcome'], error?: RelayResult['error']) => {
      if (settled) return;
      settled = true;
      clearTimeout(idle);
      opts.signal.removeEventListener('abort', onAbort);
      res.off('close', onClientClose);
      if (outcome !== 'answered') upstream.destroy();
      if (error !== undefined && !res.destroyed && !res.writableEnded) {
        // The agent's client raises this as an API error (the openai package reads `error` of an event).
        res.write(formatSse(JSON.stringify({ error })));
      }
      if (!res.writableEnded) res.end();
      resolve({ outcome, ...(error && { error }), completion: assembler.result(), events, bytes, ...(firstEventMs !== undefined && { firstEventMs }) });
    };
    const fail = (type: ModelErrorType, message: string) => settle('upstream_failed', { type, message });
    const armIdle = () => {
      clearTimeout(idle);
      idle = setTimeout(() => fail('upstream_timeout', `the model endpoint sent nothing for ${opts.idleTimeoutMs} ms in the middle of a stream`), opts.idleTimeoutMs);
    };
    const onAbort = () => fail('proxy_closing', 'the model proxy closed during the stream');
    const onClientClose = () => {
      if (!res.writableFinished) settle('aborted', { type: 'proxy_closing', message: 'the client went away during the stream' });
    };
    opts.signal.addEventListener('abort', onAbort, { once: true });
    res.once('close', onClientClose);
    res.on('drain', () => upstream.resume());
    armIdle();

    const relay = (parsed: SseEvent[]) => {
      for (const event of parsed) {
        if (sawDone) return fail('upstream_malformed', 'the model endpoint sent events after [DONE]');
        if (event.data === SSE_DONE) {
          sawDone = true;
          res.write(formatSse(SSE_DONE));
          continue;
        }
        let json: unknown;
        try {
          json = JSON.parse(event.data);
        } catch {
          return fail('upstream_malformed', `malformed event from the model endpoint (not JSON): ${JSON.stringify(event.data.slice(0, 200))}`);
        }
        if (json === null || typeof json !== 'object' || Array.isArray(json)) {
          return fail('upstream_malformed', `malformed event from the model endpoint (not a JSON object): ${JSON.stringify(event.data.slice(0, 200))}`);
        }
        const object = json as Record<string, unknown>;
        if (object.error !== undefined) {
          const message = typeof (object.error as { message?: unknown })?.message === 'string' ? (object.error as { message: string }).message : JSON.stringify(object.error).slice(0, 500);
          return fail('upstream_failed', `the model endpoint reported an error mid-stream: ${message}`);
        }
        assembler.push(object);
        const usageOnly = Array.isArray(object.choices) && object.choices.length === 0 && object.usage != null;
        if (usageOnly && !opts.forwardUsageChunk) continue;
        firstEventMs ??= Math.round(performance.now() - started);
        events += 1;
        if (!res.write(formatSse(event.data))) upstream.pause();
      }
    };
    upstream.on('data', (chunk: Buffer) => {
      if (settled) return;
      armIdle();
      bytes += chunk.length;
      if (bytes > opts.maxBytes) return fail('upstream_failed', `the streamed answer is larger than ${opts.maxBytes} bytes`);
      try {
        relay(parser.push(chunk));
      } catch (err) {
        fail('upstream_malformed', `malformed event stream from the model endpoint: ${(err as Error).message}`);
      }
    });
    upstream.once('end', () => {
      if (settled) return;
      relay(parser.end());
      if (settled) return;
      if (sawDone && !parser.pending) settle('answered');
      else fail('upstream_malformed', sawDone ? 'the event stream ended in the middle of an event' : 'the event stream ended without [DONE]');
    });
    upstream.once('error', (err) => fail('upstream_failed', `the stream from the model endpoint broke: ${err.message}`));
    upstream.once('aborted', () => fail('upstream_failed', 'the model endpoint closed the connection mid-stream'));
  });
}
