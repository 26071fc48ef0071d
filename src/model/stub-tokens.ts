// The scripted policy server's stand-in tokenizer: a text is cut into pieces of four characters (code
// points), each piece a token whose id and logprob come from a hash, so the same text always has the
// same tokens and `usage` agrees with them. Real engines differ; what matters for the tests is that
// ids and logprobs are exact, fixed and checkable end to end, in vLLM's response shapes.
import { createHash } from 'node:crypto';

export interface StubToken {
  text: string;
  id: number;
  logprob: number;
}

const TOKEN_CHARS = 4;
const VOCABULARY = 151_000;

/** The stub's tokens of a text (an empty text has none). */
export function stubTokens(text: string, salt = ''): StubToken[] {
  const chars = Array.from(text);
  const tokens: StubToken[] = [];
  for (let i = 0; i < chars.length; i += TOKEN_CHARS) {
    const piece = chars.slice(i, i + TOKEN_CHARS).join('');
    const hash = createHash('sha256').update(salt).update('\0').update(piece).digest();
    // Logprobs in (-4, 0]: a plausible spread, fixed by the piece and its position's salt.
    tokens.push({ text: piece, id: hash.readUInt32BE(0) % VOCABULARY, logprob: -(hash.readUInt16BE(4) % 4000) / 1000 });
  }
  return tokens;
}

/** Options of a request that make vLLM return token ids and logprobs. */
export interface TokenRequest {
  logprobs?: unknown;
  return_token_ids?: unknown;
  return_tokens_as_token_ids?: unknown;
}

/** `choices[].logprobs.content` as vLLM writes it. */
export function logprobsContent(tokens: readonly StubToken[], request: TokenRequest): unknown[] {
  const asIds = request.return_tokens_as_token_ids === true;
  return tokens.map((t) => ({
    token: asIds ? `token_id:${t.id}` : t.text,
    logprob: t.logprob,
    bytes: [...Buffer.from(t.text, 'utf8')],
    top_logprobs: [],
  }));
}
