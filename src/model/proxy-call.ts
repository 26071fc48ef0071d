// One request to the model proxy, from its arrival to its one line of evidence. Every route ends its
// call here, so each call is recorded exactly once (with the status the client really got), counted
// in the proxy's stats, and answered only while the client is still there to read it.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Logger } from 'pino';
import type { CallEvidence, CallOutcome, ModelCallRecord } from './call-evidence.ts';
import { Usage, errorBody, sendJson, type ModelErrorType } from './chat-protocol.ts';
import type { RelayResult } from './stream-relay.ts';
import { extractTokens } from './token-capture.ts';
import type { UpstreamAttempt, UpstreamResult } from './upstream.ts';

/** What the proxy's stats count besides the budget (see ModelProxyStats). */
export interface CallCounters {
  refused: number;
  failed: number;
  rateLimited: number;
  /** usage.prompt_tokens and usage.completion_tokens of the answers that reported them. */
  promptTokens: number;
  completionTokens: number;
}

/** Add an answer's reported usage to the counters. */
function countUsage(counters: CallCounters, body: unknown): void {
  const usage = Usage.safeParse((body as { usage?: unknown } | null | undefined)?.usage);
  if (!usage.success) return;
  counters.promptTokens += usage.data.prompt_tokens ?? 0;
  counters.completionTokens += usage.data.completion_tokens ?? 0;
}

/** What every call of one proxy shares: where it is recorded and counted. */
export interface CallLedger {
  evidence: CallEvidence;
  log: Logger;
  counters: CallCounters;
  episodeId: string;
  taskId: string;
  /** The next call's number (1, 2, ...), in order of arrival. */
  nextSeq(): number;
}

/** An upstream answer read whole (not streamed). */
export type WholeAnswer = Extract<UpstreamResult, { ok: true; body: Buffer }>;

export class ProxyCall {
  readonly record: ModelCallRecord;
  private readonly started = performance.now();

  constructor(
    private readonly ledger: CallLedger,
    readonly req: IncomingMessage,
    readonly res: ServerResponse,
  ) {
    this.record = {
      seq: ledger.nextSeq(),
      episodeId: ledger.episodeId,
      taskId: ledger.taskId,
      startedAt: new Date().toISOString(),
      durationMs: 0,
      method: req.method ?? '',
      path: (req.url ?? '').split('?')[0] ?? '',
      status: 0,
      outcome: 'refused',
    };
  }

  get log(): Logger {
    return this.ledger.log;
  }

  /** The request as parsed, or its size when it was not a JSON object. */
  set request(value: unknown) {
    this.record.request = value;
  }

  /** The upstream attempts the call took (the limits' waits included). */
  set attempts(value: UpstreamAttempt[]) {
    this.record.attempts = value;
  }

  /**
   * The call's one end: its evidence line written (before the answer, so a client that reads its answer
   * finds the call recorded), then the answer sent, unless the client has gone or already got headers.
   */
  async finish(outcome: CallOutcome, status: number, body: unknown, headers: Record<string, string> = {}, raw?: { contentType: string | undefined; body: Buffer }): Promise<void> {
    const { record, res, log } = this;
    record.outcome = outcome;
    record.status = res.destroyed && !res.writableFinished ? 0 : status;
    record.durationMs = Math.round(performance.now() - this.started);
    try {
      await this.ledger.evidence.append(record);
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
  }

  /** The proxy refuses the call itself (path, method, body, budget): nothing went upstream. */
  refuse(status: number, type: ModelErrorType, message: string, extra: Record<string, unknown> = {}, headers: Record<string, string> = {}): Promise<void> {
    this.ledger.counters.refused += 1;
    this.record.error = { type, message };
    return this.finish('refused', status, errorBody(type, message, extra), headers);
  }

  /** The call ended before an answer: `type` and `message` say why, `status` is what a client still there gets. */
  abort(status: number, type: ModelErrorType, message: string): Promise<void> {
    this.record.error = { type, message };
    return this.finish('aborted', status, errorBody(type, message));
  }

  /** No turn of the endpoint's fleet-wide limits came in time: the agent may try again. */
  rateLimited(message: string): Promise<void> {
    this.ledger.counters.rateLimited += 1;
    this.record.error = { type: 'rate_limited', message };
    return this.finish('refused', 429, errorBody('rate_limited', message), { 'retry-after': '1' });
  }

  /** Every upstream attempt failed. */
  upstreamFailed(result: Extract<UpstreamResult, { ok: false }>): Promise<void> {
    this.ledger.counters.failed += 1;
    this.record.error = { type: 'upstream_failed', message: result.message };
    this.log.warn({ seq: this.record.seq, attempts: result.attempts.length, lastStatus: result.lastStatus }, 'model endpoint failed');
    return this.finish('upstream_failed', 502, errorBody('upstream_failed', result.message, {
      attempts: result.attempts.length,
      ...(result.lastStatus !== undefined ? { upstreamStatus: result.lastStatus } : {}),
    }));
  }

  /**
   * The endpoint's whole answer, passed on byte for byte; `json` is it parsed (undefined when it is
   * not a JSON object), `charged` the tokens the budget was charged for it (chat calls only).
   */
  answered(answer: WholeAnswer, json: Record<string, unknown> | undefined, charged?: number): Promise<void> {
    const { record } = this;
    record.response = json ?? answer.body.toString('utf8');
    const captured = json !== undefined ? extractTokens(json) : undefined;
    if (captured !== undefined) record.capture = captured;
    if (charged !== undefined) {
      record.tokens = charged;
      countUsage(this.ledger.counters, json);
    }
    return this.finish('answered', answer.status, undefined, {}, { contentType: answer.contentType, body: answer.body });
  }

  /**
   * A relayed stream has ended (the agent already has every event): its reassembled answer recorded;
   * `charged` the tokens the budget was charged for it, undefined when it was given back.
   */
  streamed(relay: RelayResult, charged: number | undefined): Promise<void> {
    const { record } = this;
    record.response = relay.completion;
    record.stream = { events: relay.events, bytes: relay.bytes, ...(relay.firstEventMs !== undefined && { firstEventMs: relay.firstEventMs }) };
    const captured = extractTokens(relay.completion);
    if (captured !== undefined) record.capture = captured;
    if (charged !== undefined) {
      record.tokens = charged;
      countUsage(this.ledger.counters, relay.completion);
    }
    if (relay.error !== undefined) record.error = relay.error;
    if (relay.outcome === 'upstream_failed') {
      this.ledger.counters.failed += 1;
      this.log.warn({ seq: record.seq, err: relay.error?.message }, 'model stream failed');
    }
    return this.finish(relay.outcome, relay.outcome === 'aborted' ? 0 : 200, undefined);
  }
}
