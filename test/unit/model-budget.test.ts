// The per-episode model budget: admission, reservation of max_tokens while in flight, settling.
import { describe, expect, it } from 'vitest';
import { ModelBudget } from '../../src/model/model-budget.ts';
import { requestedMaxTokens, usedTokens, ChatRequest } from '../../src/model/chat-protocol.ts';

describe('model budget', () => {
  it('counts answered calls and their tokens; gives back calls the model never answered', () => {
    const b = new ModelBudget({ maxCalls: 2, maxTokens: 100_000 });
    const a = b.admit(undefined);
    const lost = b.admit(undefined);
    expect(a.ok && lost.ok).toBe(true);
    // Two in flight fill the call budget.
    expect(b.admit(undefined)).toMatchObject({ ok: false, refusal: { budget: 'calls', limit: 2, used: 2 } });
    if (!a.ok || !lost.ok) return;
    b.settle(a.ticket, { answered: true, tokens: 120 });
    b.settle(lost.ticket, { answered: false });
    b.settle(lost.ticket, { answered: true, tokens: 999 }); // a second settle changes nothing
    expect([b.calls, b.tokens]).toEqual([1, 120]);
    expect(b.admit(undefined).ok).toBe(true);
  });

  it('reserves max_tokens of calls in flight, so parallel calls cannot overrun the tokens', () => {
    const b = new ModelBudget({ maxCalls: 10, maxTokens: 1000 });
    const first = b.admit(600);
    expect(first.ok).toBe(true);
    expect(b.admit(401)).toMatchObject({ ok: false, refusal: { budget: 'tokens', message: 'max_tokens 401 exceeds the remaining token budget of 400 (600 of 1000 used, 600 of them reserved by calls in flight)' } });
    expect(b.admit(400).ok).toBe(true);
    expect(b.admit(undefined)).toMatchObject({ ok: false, refusal: { budget: 'tokens', message: 'token budget used up: 1000 of 1000 tokens, 1000 of them reserved by calls in flight' } });
    if (first.ok) b.settle(first.ticket, { answered: true, tokens: 50 });
    expect(b.admit(550).ok).toBe(true);
  });

  it('reserves the prompt and a default output for calls that name no max_tokens: 20 at once overrun by one call at most', () => {
    const b = new ModelBudget({ maxCalls: 100, maxTokens: 110 });
    const admitted = Array.from({ length: 20 }, () => b.admit(undefined, 26)).filter((a) => a.ok);
    expect(admitted).toHaveLength(1);
    expect(b.admit(undefined, 26)).toMatchObject({ ok: false, refusal: { budget: 'tokens', message: 'token budget used up: 110 of 110 tokens, 110 of them reserved by calls in flight' } });
    b.settle(admitted[0]!.ticket, { answered: true, tokens: 52 });
    // One at a time from here: each admitted while tokens remain; the last one may overrun.
    for (;;) {
      const next = b.admit(undefined, 26);
      if (!next.ok) break;
      expect(b.admit(undefined, 26).ok).toBe(false);
      b.settle(next.ticket, { answered: true, tokens: 52 });
    }
    expect(b.tokens).toBe(156);
    expect(b.tokens).toBeLessThanOrEqual(110 + 52);
  });

  it('rejects limits that are not positive integers, naming the field', () => {
    expect(() => new ModelBudget({ maxCalls: 1.5, maxTokens: 10 })).toThrow('Expected `maxCalls` to be an integer from 1 up, got `1.5` (number)');
    expect(() => new ModelBudget({ maxCalls: 1, maxTokens: 0 })).toThrow('Expected `maxTokens` to be an integer from 1 up, got `0` (number)');
  });

  it('reads usage and max tokens as the API defines them', () => {
    expect(usedTokens({ usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } })).toBe(15);
    expect(usedTokens({ usage: { prompt_tokens: 10, completion_tokens: 5 } })).toBe(15);
    expect(usedTokens({ choices: [] })).toBeUndefined();
    expect(usedTokens(null)).toBeUndefined();
    const req = (extra: object) => ChatRequest.parse({ messages: [{ role: 'user', content: 'x' }], ...extra });
    expect(requestedMaxTokens(req({ max_tokens: 100, max_completion_tokens: 50 }))).toBe(50);
    expect(requestedMaxTokens(req({ max_tokens: 100 }))).toBe(100);
    expect(requestedMaxTokens(req({ max_tokens: null }))).toBeUndefined();
  });
});
