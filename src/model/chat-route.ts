// POST /v1/chat/completions through the model proxy: the body read (capped) and checked, the
// configured model and the capture fields put in, the call admitted under the episode's budget, sent
// upstream, and the answer passed on whole or relayed event by event, its tokens charged.
import { describeIssues } from '../config/zod-issues.ts';
import {
  BodyTooLargeError,
  ChatRequest,
  estimateTokens,
  parseJsonObject,
  readBody,
  requestedMaxTokens,
  usedTokens,
} from './chat-protocol.ts';
import type { ModelBudget } from './model-budget.ts';
import type { ProxyCall } from './proxy-call.ts';
import { forwardUpstream, type UpstreamSettings } from './proxy-upstream.ts';
import { relayStream, type RelayResult } from './stream-relay.ts';
import { withCaptureFields } from './token-capture.ts';
import { applyOverrides, type RequestOverrides } from './request-overrides.ts';

export interface ChatRouteSettings {
  upstream: UpstreamSettings;
  budget: ModelBudget;
  /** Largest request body accepted; larger gets 413. */
  maxBodyBytes: number;
  /** Longest silence of the endpoint in the middle of a stream. */
  streamIdleTimeoutMs: number;
  /** The model name and sampling parameters put into every request (request-overrides.ts). */
  overrides: RequestOverrides;
  /** Ask the endpoint for token ids and logprobs. */
  captureTokens: boolean;
}

export async function handleChat(call: ProxyCall, settings: ChatRouteSettings): Promise<void> {
  const { maxBodyBytes, budget } = settings;
  let body: Buffer;
  try {
    body = await readBody(call.req, maxBodyBytes);
  } catch (err) {
    if (err instanceof BodyTooLargeError) {
      return call.refuse(413, 'body_too_large', `request body is larger than ${maxBodyBytes} bytes`, { limitBytes: maxBodyBytes }, { connection: 'close' });
    }
    // The client went away while sending; nobody is left to answer, but the call is recorded.
    return call.abort(400, 'invalid_request', `request body not received: ${(err as Error).message}`);
  }
  const asSent = parseJsonObject(body);
  // The evidence keeps the request as the agent sent it; upstream gets it with the overrides.
  call.request = asSent ?? { notJson: true, bytes: body.length };
  if (asSent === undefined) return call.refuse(400, 'invalid_request', 'request body is not a JSON object');
  const json = applyOverrides(asSent, settings.overrides);
  const parsed = ChatRequest.safeParse(json);
  if (!parsed.success) return call.refuse(400, 'invalid_request', `invalid chat request: ${describeIssues(parsed.error, json).join('; ')}`);
  const streaming = parsed.data.stream === true;
  if (streaming && (parsed.data.n ?? 1) > 1) {
    return call.refuse(400, 'invalid_request', `n is ${parsed.data.n}: a streamed call (stream: true) must ask for one choice; send n: 1 or stream: false`, { param: 'n' });
  }
  let forwarded: Record<string, unknown> = json;
  if (settings.captureTokens) forwarded = withCaptureFields(forwarded);
  let forwardUsageChunk = false;
  if (streaming) {
    // Usage comes only in a last chunk the agent may not have asked for: asked upstream, kept from the agent.
    forwardUsageChunk = parsed.data.stream_options?.include_usage === true;
    forwarded = { ...forwarded, stream_options: { ...parsed.data.stream_options, include_usage: true } };
  }
  const upstreamBody = Buffer.from(JSON.stringify(forwarded));
  const promptTokens = estimateTokens(upstreamBody.toString('utf8'));

  const admission = budget.admit(requestedMaxTokens(parsed.data), promptTokens);
  if (!admission.ok) {
    const { budget: which, limit, used, message } = admission.refusal;
    return call.refuse(429, 'budget_exceeded', message, { budget: which, limit, used });
  }
  const { ticket } = admission;
  const sent = await forwardUpstream(call, settings.upstream, { method: 'POST', path: '/chat/completions', body: upstreamBody, stream: streaming }, () =>
    budget.settle(ticket, { answered: false }),
  );
  if (sent === undefined) return;
  const { answer } = sent;

  if ('stream' in answer) {
    let relay: RelayResult;
    try {
      relay = await relayStream(answer.stream, call.res, {
        idleTimeoutMs: settings.streamIdleTimeoutMs,
        maxBytes: settings.upstream.maxResponseBytes,
        forwardUsageChunk,
        signal: settings.upstream.closing,
      });
    } finally {
      sent.detach();
    }
    const tokens = usedTokens(relay.completion) ?? promptTokens + estimateTokens(JSON.stringify(relay.completion.choices ?? []));
    sent.release(tokens);
    // What streamed before a failure was generated, so it is charged; only a call with nothing is given back.
    const answered = relay.outcome === 'answered' || relay.events > 0;
    budget.settle(ticket, { answered, tokens });
    return call.streamed(relay, answered ? tokens : undefined);
  }
  const answerJson = parseJsonObject(answer.body);
  const tokens = answerJson !== undefined ? (usedTokens(answerJson) ?? 0) : 0;
  sent.release(tokens);
  budget.settle(ticket, { answered: true, tokens });
  return call.answered(answer, answerJson, tokens);
}
