// The slice of the OpenAI chat-completions protocol that the model proxy and the scripted policy
// server read: request fields that matter for budgets and routing, tool-call shapes, usage, and the
// JSON error body both answer with. Everything else in a request passes through untouched.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { z } from 'zod';

/** The paths a sandbox may reach, relative to the API root (`/v1`). */
export const CHAT_COMPLETIONS_PATH = '/v1/chat/completions';
export const MODELS_PATH = '/v1/models';
export const RESPONSES_PATH = '/v1/responses';

/** Headers the proxy adds upstream; real endpoints ignore them, the scripted policy server uses them. */
export const EPISODE_HEADER = 'x-rollout-episode';
export const TASK_HEADER = 'x-rollout-task';

const tokenCount = z.number().int().nonnegative();

export const ToolCall = z.looseObject({
  id: z.string(),
  type: z.literal('function'),
  function: z.looseObject({ name: z.string(), arguments: z.string() }),
});
export type ToolCall = z.infer<typeof ToolCall>;

export const ChatMessage = z.looseObject({
  role: z.string(),
  content: z.unknown().optional(),
  tool_calls: z.array(ToolCall).optional(),
  tool_call_id: z.string().optional(),
});
export type ChatMessage = z.infer<typeof ChatMessage>;

/** A chat-completions request body; unknown fields are kept and forwarded as sent. */
export const ChatRequest = z.looseObject({
  model: z.string().optional(),
  messages: z.array(ChatMessage).min(1),
  stream: z.boolean().optional(),
  /** Choices per call; a streamed call must ask for one (the proxy relays and records a single choice). */
  n: z.number().int().min(1).nullish(),
  stream_options: z.looseObject({ include_usage: z.boolean().optional() }).nullish(),
  max_tokens: tokenCount.nullish(),
  max_completion_tokens: tokenCount.nullish(),
});
export type ChatRequest = z.infer<typeof ChatRequest>;

export const Usage = z.looseObject({
  prompt_tokens: tokenCount.optional(),
  completion_tokens: tokenCount.optional(),
  total_tokens: tokenCount.optional(),
});
export type Usage = z.infer<typeof Usage>;

/** Tokens a response used: `total_tokens`, else prompt + completion; undefined when it says nothing. */
export function usedTokens(body: unknown): number | undefined {
  const usage = Usage.safeParse((body as { usage?: unknown } | null)?.usage);
  if (!usage.success) return undefined;
  const { total_tokens, prompt_tokens, completion_tokens } = usage.data;
  if (total_tokens !== undefined) return total_tokens;
  if (prompt_tokens === undefined && completion_tokens === undefined) return undefined;
  return (prompt_tokens ?? 0) + (completion_tokens ?? 0);
}

/** The output tokens a request asks for at most (`max_completion_tokens` wins, as in the API). */
export function requestedMaxTokens(req: ChatRequest): number | undefined {
  return req.max_completion_tokens ?? req.max_tokens ?? undefined;
}

// The tools of the reference agent, as the scripted policy server calls them. Arguments travel as a
// JSON string in `function.arguments`.
export const BashArgs = z.strictObject({ command: z.string().min(1), timeoutSec: z.number().positive().optional() });
export type BashArgs = z.infer<typeof BashArgs>;
export const ReadFileArgs = z.strictObject({ path: z.string().min(1) });
export type ReadFileArgs = z.infer<typeof ReadFileArgs>;
/** Writes `content` (UTF-8) to `path`, creating missing parent folders. */
export const WriteFileArgs = z.strictObject({ path: z.string().min(1), content: z.string() });
export type WriteFileArgs = z.infer<typeof WriteFileArgs>;
export const FinishArgs = z.strictObject({ answer: z.string() });
export type FinishArgs = z.infer<typeof FinishArgs>;

export type ToolInvocation =
  | { name: 'bash'; arguments: BashArgs }
  | { name: 'read_file'; arguments: ReadFileArgs }
  | { name: 'write_file'; arguments: WriteFileArgs }
  | { name: 'finish'; arguments: FinishArgs };

/** Error types of the JSON error body (`{ error: { type, message, ... } }`, as OpenAI answers). */
export type ModelErrorType =
  | 'not_found'
  | 'method_not_allowed'
  | 'invalid_request'
  | 'upstream_timeout'
  | 'upstream_malformed'
  | 'rate_limited'
  | 'body_too_large'
  | 'budget_exceeded'
  | 'upstream_failed'
  | 'proxy_closing'
  | 'unauthorized'
  | 'unknown_task'
  | 'policy_stale'
  | 'internal_error';

export interface ModelErrorBody {
  error: { type: ModelErrorType; message: string } & Record<string, unknown>;
}

export function errorBody(type: ModelErrorType, message: string, extra: Record<string, unknown> = {}): ModelErrorBody {
  return { error: { type, message, ...extra } };
}

export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

export class BodyTooLargeError extends Error {
  override readonly name = 'BodyTooLargeError';
  constructor(readonly limitBytes: number) {
    super(`request body is larger than ${limitBytes} bytes`);
  }
}

/** Read a request body, refusing (before reading, when Content-Length says so) more than `limitBytes`. */
export async function readBody(req: IncomingMessage, limitBytes: number): Promise<Buffer> {
  const declared = Number(req.headers['content-length']);
  if (Number.isFinite(declared) && declared > limitBytes) throw new BodyTooLargeError(limitBytes);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > limitBytes) throw new BodyTooLargeError(limitBytes);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

/** Parse a body as a JSON object; undefined when it is not one. */
export function parseJsonObject(body: Buffer): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(body.toString('utf8'));
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}

/** Rough token count of a text as models bill it (about four characters a token). */
export function estimateTokens(text: string): number {
  return Math.ceil(text.length / 4);
}
