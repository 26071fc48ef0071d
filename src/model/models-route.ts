// GET /v1/models through the model proxy: the endpoint's list passed on as it came. Free: listing
// models spends no budget (the endpoint's fleet-wide limits still count it).
import { parseJsonObject, usedTokens } from './chat-protocol.ts';
import type { ProxyCall } from './proxy-call.ts';
import { forwardUpstream, type UpstreamSettings } from './proxy-upstream.ts';

export async function handleModels(call: ProxyCall, upstream: UpstreamSettings): Promise<void> {
  const sent = await forwardUpstream(call, upstream, { method: 'GET', path: '/models', stream: false }, () => undefined);
  if (sent === undefined) return;
  const { answer } = sent;
  // Asked without `stream`, the answer always comes whole.
  if (!('body' in answer)) throw new Error('the model endpoint streamed a model list that was asked for whole');
  const json = parseJsonObject(answer.body);
  sent.release(json !== undefined ? (usedTokens(json) ?? 0) : 0);
  return call.answered(answer, json);
}
