// Token-exact capture: the token ids and logprobs an inference engine produced, kept per call so a
// trainer never retokenizes text (which drifts). Read from vLLM's shapes (`prompt_token_ids`,
// `choices[].token_ids`, `choices[].logprobs.content[]`, whose `token` reads `token_id:<id>` when
// `return_tokens_as_token_ids` is set) and from any endpoint that returns OpenAI-style logprobs.
// `captureRequestFields` are the fields that make vLLM return them (`model: { capture: tokens }`).

type Json = Record<string, unknown>;

/** What a batch asks the proxy to capture of each model call. */
export type CaptureMode = 'none' | 'tokens';

/** Request fields vLLM answers with token ids and logprobs; a request's own values are kept. */
export const CAPTURE_REQUEST_FIELDS: Readonly<Json> = {
  logprobs: true,
  return_tokens_as_token_ids: true,
  return_token_ids: true,
};

/** The request body with the capture fields added where the agent did not set them. */
export function withCaptureFields(body: Json): Json {
  return { ...CAPTURE_REQUEST_FIELDS, ...body };
}

export interface ChoiceTokens {
  index: number;
  /** The completion's token ids, in order. */
  tokenIds?: number[];
  /** The log probability of each completion token, in order. */
  logprobs?: number[];
  /** The token strings of the logprobs, when they are not `token_id:<id>`. */
  tokens?: string[];
}

export interface TokenCapture {
  promptTokenIds?: number[];
  choices: ChoiceTokens[];
}

const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);
const isTokenIds = (v: unknown): v is number[] => Array.isArray(v) && v.every((t) => Number.isInteger(t) && t >= 0);
const TOKEN_ID = /^token_id:(\d+)$/;

/** The token ids and logprobs of a chat.completion (or a reassembled stream); undefined when it has none. */
export function extractTokens(completion: unknown): TokenCapture | undefined {
  if (!isObject(completion)) return undefined;
  const capture: TokenCapture = { choices: [] };
  if (isTokenIds(completion.prompt_token_ids)) capture.promptTokenIds = completion.prompt_token_ids;
  const choices = Array.isArray(completion.choices) ? completion.choices : [];
  for (const [position, choice] of choices.entries()) {
    if (!isObject(choice)) continue;
    const entry: ChoiceTokens = { index: Number.isInteger(choice.index) ? (choice.index as number) : position };
    if (isTokenIds(choice.token_ids)) entry.tokenIds = choice.token_ids;
    const content = isObject(choice.logprobs) && Array.isArray(choice.logprobs.content) ? choice.logprobs.content : undefined;
    if (content !== undefined && content.length > 0) {
      const logprobs: number[] = [];
      const fromTokens: number[] = [];
      const strings: string[] = [];
      for (const item of content) {
        const logprob = isObject(item) ? item.logprob : undefined;
        const token = isObject(item) ? item.token : undefined;
        logprobs.push(typeof logprob === 'number' ? logprob : Number.NaN);
        const id = typeof token === 'string' ? TOKEN_ID.exec(token) : null;
        if (id !== null) fromTokens.push(Number(id[1]));
        else strings.push(typeof token === 'string' ? token : '');
      }
      entry.logprobs = logprobs;
      if (entry.tokenIds === undefined && fromTokens.length === content.length) entry.tokenIds = fromTokens;
      if (strings.length === content.length) entry.tokens = strings;
    }
    if (entry.tokenIds !== undefined || entry.logprobs !== undefined) capture.choices.push(entry);
  }
  return capture.promptTokenIds !== undefined || capture.choices.length > 0 ? capture : undefined;
}
