// An attempt's trajectory, read from the model calls its proxy recorded (so it exists for any agent,
// not only the reference one): the conversation as OpenAI-style messages, and per assistant turn the
// answer, its finish reason, usage, timing, and the token ids and logprobs exactly as the endpoint
// returned them (when it did: `model: { capture: tokens }` with vLLM). A trainer reads this, never the
// agent's stdout. Written at close as trajectory.json beside model-calls.jsonl.
import type { ModelCallRecord } from '../model/call-evidence.ts';
import { CHAT_COMPLETIONS_PATH } from '../model/chat-protocol.ts';

export const TRAJECTORY_FILE = 'trajectory.json';
export const TRAJECTORY_VERSION = 1;

export interface TrajectoryTurn {
  /** The call's `seq` in model-calls.jsonl. */
  seq: number;
  startedAt: string;
  durationMs: number;
  streamed: boolean;
  /**
   * Where this turn's answer sits in `messages`; its prompt is `messages` before it. -1 when the
   * agent sent a prompt that is not a prefix of the final conversation (it rewrote or forked its
   * history): then `prompt` holds that turn's own messages.
   */
  messageIndex: number;
  prompt?: unknown[];
  /** The assistant message of the answer (a stream reassembled). */
  message: unknown;
  finishReason: unknown;
  usage?: unknown;
  promptTokenIds?: number[];
  completionTokenIds?: number[];
  /** One per completion token, in order. */
  logprobs?: number[];
  /** The endpoint's policy version current when the call started (absent: none was set). */
  policyVersion?: number;
}

export interface Trajectory {
  version: typeof TRAJECTORY_VERSION;
  episodeId: string;
  taskId: string;
  attempt: number;
  /** The conversation: the last answered call's prompt and its answer. */
  messages: unknown[];
  turns: TrajectoryTurn[];
  /** Chat calls by outcome (answered ones are the turns). */
  calls: Record<ModelCallRecord['outcome'], number>;
  /** Turns whose endpoint returned completion token ids. */
  turnsWithTokenIds: number;
}

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);

function answered(record: ModelCallRecord): { prompt: unknown[]; choice: Json; response: Json } | undefined {
  if (record.path !== CHAT_COMPLETIONS_PATH || record.outcome !== 'answered' || record.status !== 200) return undefined;
  const request = isObject(record.request) ? record.request : undefined;
  const response = isObject(record.response) ? record.response : undefined;
  const choice = Array.isArray(response?.choices) ? response.choices.find(isObject) : undefined;
  if (request === undefined || response === undefined || choice === undefined || !Array.isArray(request.messages)) return undefined;
  return { prompt: request.messages, choice, response };
}

const sameJson = (a: unknown, b: unknown) => JSON.stringify(a) === JSON.stringify(b);

export function buildTrajectory(records: readonly ModelCallRecord[], meta: { episodeId: string; taskId: string; attempt: number }): Trajectory {
  const calls: Trajectory['calls'] = { answered: 0, refused: 0, upstream_failed: 0, aborted: 0 };
  const turns: Array<{ record: ModelCallRecord; prompt: unknown[]; choice: Json; response: Json }> = [];
  for (const record of records) {
    if (record.path !== CHAT_COMPLETIONS_PATH) continue;
    calls[record.outcome] += 1;
    const turn = answered(record);
    if (turn !== undefined) turns.push({ record, ...turn });
  }
  const last = turns.at(-1);
  const messages = last === undefined ? [] : [...last.prompt, last.choice.message];
  let turnsWithTokenIds = 0;
  const out = turns.map(({ record, prompt, choice, response }): TrajectoryTurn => {
    const isPrefix = prompt.length < messages.length && prompt.every((m, i) => sameJson(m, messages[i])) && sameJson(choice.message, messages[prompt.length]);
    const tokens = record.capture?.choices.find((c) => c.index === (Number.isInteger(choice.index) ? choice.index : 0));
    if (tokens?.tokenIds !== undefined) turnsWithTokenIds += 1;
    return {
      seq: record.seq,
      startedAt: record.startedAt,
      durationMs: record.durationMs,
      streamed: record.stream !== undefined,
      messageIndex: isPrefix ? prompt.length : -1,
      ...(!isPrefix && { prompt }),
      message: choice.message,
      finishReason: choice.finish_reason ?? null,
      ...(response.usage !== undefined && { usage: response.usage }),
      ...(record.capture?.promptTokenIds !== undefined && { promptTokenIds: record.capture.promptTokenIds }),
      ...(tokens?.tokenIds !== undefined && { completionTokenIds: tokens.tokenIds }),
      ...(tokens?.logprobs !== undefined && { logprobs: tokens.logprobs }),
      ...(record.policyVersion !== undefined && { policyVersion: record.policyVersion }),
    };
  });
  return { version: TRAJECTORY_VERSION, ...meta, messages, turns: out, calls, turnsWithTokenIds };
}
