// The per-episode model budget: admission, reservation of max_tokens while in flight, settling.
import { describe, expect, it } from 'vitest';
import { ModelBudget } from '../../src/model/model-budget.ts';
import { requestedMaxTokens, usedTokens, ChatRequest } from '../../src/model/chat-protocol.ts';

describe('model budget', () => {
  it('counts answered calls and their tokens; gives back calls the model never answered', () => {
    const b = new ModelBudget({ maxCalls: 2, maxTokens: 1000 });
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
    expect(b.admit(401)).toMatchObject({ ok: false, refusal: { budget: 'tokens', message: 'max_tokens 401 exceeds the remaining token budget of 400 (600 of 1000 used)' } });
    expect(b.admit(400).ok).toBe(true);
    expect(b.admit(undefined)).toMatchObject({ ok: false, refusal: { budget: 'tokens', message: 'token budget used up: 1000 of 1000 tokens' } });
    if (first.ok) b.settle(first.ticket, { answered: true, tokens: 50 });
    expect(b.admit(550).ok).toBe(true);
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
