// Relays a streamed Responses API answer from the endpoint to the agent event by event, as it comes,
// `event:` line and all, while keeping what the evidence needs: the response object of the terminal
// event (`response.completed`, `.incomplete` or `.failed`, which carries the output and the usage), or
// what the text deltas added up to when the stream broke first. Unlike chat completions there is no
// `[DONE]`: the stream ends after its terminal event. An upstream that stalls, sends what is not a
// JSON object, sends an `error` event, or ends without a terminal event ends the stream with an
// `error` event the agent's client raises; an agent that goes away aborts the upstream call.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { ModelErrorType } from './chat-protocol.ts';
import { RESPONSE_TERMINAL_EVENTS } from './responses-protocol.ts';
import { SseParser, type SseEvent } from './sse.ts';
import type { RelayOptions, RelayResult } from './stream-relay.ts';

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);

function formatEvent(event: string | undefined, data: string): string {
  return `${event !== undefined ? `event: ${event}\n` : ''}data: ${data}\n\n`;
}

export function relayResponsesStream(upstream: IncomingMessage, res: ServerResponse, opts: Omit<RelayOptions, 'forwardUsageChunk'>): Promise<RelayResult> {
  const started = performance.now();
  const parser = new SseParser();
  let events = 0;
  let bytes = 0;
  let firstEventMs: number | undefined;
  let final: Json | undefined;
  let created: Json | undefined;
  let text = '';

  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
  res.flushHeaders();

  // What arrived, when the stream broke before its terminal event.
  const partial = (): Json => ({ ...(created ?? { object: 'response' }), status: 'incomplete', output_text: text });

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
        res.write(formatEvent('error', JSON.stringify({ type: 'error', error })));
      }
      if (!res.writableEnded) res.end();
      resolve({ outcome, ...(error && { error }), completion: final ?? partial(), events, bytes, ...(firstEventMs !== undefined && { firstEventMs }) });
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
        if (final !== undefined) return fail('upstream_malformed', `the model endpoint sent events after ${String((final as { status?: unknown }).status ?? 'the terminal event')}`);
        let json: unknown;
        try {
          json = JSON.parse(event.data);
        } catch {
          return fail('upstream_malformed', `malformed event from the model endpoint (not JSON): ${JSON.stringify(event.data.slice(0, 200))}`);
        }
        if (!isObject(json)) return fail('upstream_malformed', `malformed event from the model endpoint (not a JSON object): ${JSON.stringify(event.data.slice(0, 200))}`);
        const type = typeof json.type === 'string' ? json.type : event.event;
        if (type === 'error') {
          const err = isObject(json.error) ? json.error : json;
          const message = typeof err.message === 'string' ? err.message : JSON.stringify(err).slice(0, 500);
          return fail('upstream_failed', `the model endpoint reported an error mid-stream: ${message}`);
        }
        if (type === 'response.created' && isObject(json.response)) created = json.response;
        if (type === 'response.output_text.delta' && typeof json.delta === 'string') text += json.delta;
        firstEventMs ??= Math.round(performance.now() - started);
        events += 1;
        const written = res.write(formatEvent(event.event, event.data));
        if ((RESPONSE_TERMINAL_EVENTS as readonly (string | undefined)[]).includes(type)) {
          final = isObject(json.response) ? json.response : partial();
        }
        if (!written) upstream.pause();
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
      if (final !== undefined && !parser.pending) settle('answered');
      else fail('upstream_malformed', final !== undefined ? 'the event stream ended in the middle of an event' : 'the event stream ended without response.completed');
    });
    upstream.once('error', (err) => fail('upstream_failed', `the stream from the model endpoint broke: ${err.message}`));
    upstream.once('aborted', () => fail('upstream_failed', 'the model endpoint closed the connection mid-stream'));
  });
}
