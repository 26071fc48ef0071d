// POST /v1/responses (the OpenAI Responses API) through the model proxy, as chat completions go: the
// body read (capped) and checked, the configured model put in, the call admitted under the episode's
// budget, sent upstream under the endpoint's fleet-wide limits and retries, and the answer passed on
// whole or relayed event by event (`event:` lines kept), its tokens (`usage.input_tokens` +
// `output_tokens`) charged and recorded. Token capture is for chat completions only (vLLM returns
// token ids there); a Responses call's evidence keeps the request and the response object.
import { applyOverrides } from './request-overrides.ts';
import { describeIssues } from '../config/zod-issues.ts';
import { BodyTooLargeError, estimateTokens, parseJsonObject, readBody } from './chat-protocol.ts';
import type { ChatRouteSettings } from './chat-route.ts';
import type { ProxyCall } from './proxy-call.ts';
import { forwardUpstream } from './proxy-upstream.ts';
import { ResponsesRequest, responseTokens } from './responses-protocol.ts';
import { relayResponsesStream } from './responses-relay.ts';
import type { RelayResult } from './stream-relay.ts';

export async function handleResponses(call: ProxyCall, settings: ChatRouteSettings): Promise<void> {
  const { maxBodyBytes, budget } = settings;
  let body: Buffer;
  try {
    body = await readBody(call.req, maxBodyBytes);
  } catch (err) {
    if (err instanceof BodyTooLargeError) {
      return call.refuse(413, 'body_too_large', `request body is larger than ${maxBodyBytes} bytes`, { limitBytes: maxBodyBytes }, { connection: 'close' });
    }
    return call.abort(400, 'invalid_request', `request body not received: ${(err as Error).message}`);
  }
  const json = parseJsonObject(body);
  call.request = json ?? { notJson: true, bytes: body.length };
  if (json === undefined) return call.refuse(400, 'invalid_request', 'request body is not a JSON object');
  const parsed = ResponsesRequest.safeParse(json);
  if (!parsed.success) return call.refuse(400, 'invalid_request', `invalid responses request: ${describeIssues(parsed.error, json).join('; ')}`);
  const streaming = parsed.data.stream === true;
  // The model name and the batch's sampling as for chat completions, in the Responses API's names.
  const { max_tokens: maxTokens, seed: _seed, ...sampling } = settings.overrides.sampling ?? {};
  const forwarded = applyOverrides(json, { ...settings.overrides, sampling: { ...sampling, ...(maxTokens !== undefined && { max_output_tokens: maxTokens }) } });
  const upstreamBody = Buffer.from(JSON.stringify(forwarded));
  const promptTokens = estimateTokens(upstreamBody.toString('utf8'));

  const admission = budget.admit(parsed.data.max_output_tokens ?? undefined, promptTokens);
  if (!admission.ok) {
    const { budget: which, limit, used, message } = admission.refusal;
    return call.refuse(429, 'budget_exceeded', message, { budget: which, limit, used });
  }
  const { ticket } = admission;
  const sent = await forwardUpstream(call, settings.upstream, { method: 'POST', path: '/responses', body: upstreamBody, stream: streaming }, () =>
    budget.settle(ticket, { answered: false }),
  );
  if (sent === undefined) return;
  const { answer } = sent;

  if ('stream' in answer) {
    let relay: RelayResult;
    try {
      relay = await relayResponsesStream(answer.stream, call.res, {
        idleTimeoutMs: settings.streamIdleTimeoutMs,
        maxBytes: settings.upstream.maxResponseBytes,
        signal: settings.upstream.closing,
      });
    } finally {
      sent.detach();
    }
    const output = typeof relay.completion.output_text === 'string' ? relay.completion.output_text : JSON.stringify(relay.completion.output ?? []);
    const tokens = responseTokens(relay.completion) ?? promptTokens + estimateTokens(output);
    sent.release(tokens);
    const answered = relay.outcome === 'answered' || relay.events > 0;
    budget.settle(ticket, { answered, tokens });
    return call.streamed(relay, answered ? tokens : undefined);
  }
  const answerJson = parseJsonObject(answer.body);
  const tokens = answerJson !== undefined ? (responseTokens(answerJson) ?? 0) : 0;
  sent.release(tokens);
  budget.settle(ticket, { answered: true, tokens });
  return call.answered(answer, answerJson, tokens);
}
