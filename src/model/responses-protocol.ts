// The slice of the OpenAI Responses API (POST /v1/responses) the model proxy and the scripted policy
// server read: the request fields that matter for budgets and streaming, and its usage
// (`input_tokens`, `output_tokens`, `total_tokens`). Everything else in a request passes through.
import { z } from 'zod';

const tokenCount = z.number().int().nonnegative();

/** A Responses request body; unknown fields are kept and forwarded as sent. */
export const ResponsesRequest = z.looseObject({
  model: z.string().optional(),
  /** A string, or a list of input items (messages, function call outputs, ...). */
  input: z.union([z.string(), z.array(z.unknown())]),
  instructions: z.string().nullish(),
  stream: z.boolean().nullish(),
  max_output_tokens: tokenCount.nullish(),
});
export type ResponsesRequest = z.infer<typeof ResponsesRequest>;

export const ResponsesUsage = z.looseObject({
  input_tokens: tokenCount.optional(),
  output_tokens: tokenCount.optional(),
  total_tokens: tokenCount.optional(),
});

/** Tokens a response object used: `total_tokens`, else input + output; undefined when it says nothing. */
export function responseTokens(response: unknown): number | undefined {
  const usage = ResponsesUsage.safeParse((response as { usage?: unknown } | null)?.usage);
  if (!usage.success) return undefined;
  const { total_tokens, input_tokens, output_tokens } = usage.data;
  if (total_tokens !== undefined) return total_tokens;
  if (input_tokens === undefined && output_tokens === undefined) return undefined;
  return (input_tokens ?? 0) + (output_tokens ?? 0);
}

/** The events that end a streamed response; `response.completed` carries the usage. */
export const RESPONSE_TERMINAL_EVENTS = ['response.completed', 'response.incomplete', 'response.failed'] as const;
