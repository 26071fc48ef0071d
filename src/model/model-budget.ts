// The per-episode model budget: calls and tokens. A call is admitted only while both have room; its
// prompt and max_tokens (or a default output reserve) are reserved while it is in flight, so parallel
// calls cannot overrun the budget together. Tokens are charged from the response's usage when it comes back.

/** Limits of one episode's model use. */
export interface ModelBudgetLimits {
  /** Calls the model answered, in flight included. */
  maxCalls: number;
  /** Sum of `usage.total_tokens` of the answers. */
  maxTokens: number;
}

export interface BudgetRefusal {
  budget: 'calls' | 'tokens';
  limit: number;
  used: number;
  message: string;
}

/** A call admitted under the budget; settle it exactly once. */
export interface BudgetTicket {
  readonly reservedTokens: number;
  settled: boolean;
}

export type Admission = { ok: true; ticket: BudgetTicket } | { ok: false; refusal: BudgetRefusal };

/** Output tokens reserved for a call that names no max_tokens (it could use as many as the model allows). */
export const UNBOUNDED_OUTPUT_RESERVE = 4_096;

export class ModelBudget {
  private answeredCalls = 0;
  private usedTokens = 0;
  private inFlight = 0;
  private reserved = 0;

  constructor(readonly limits: ModelBudgetLimits) {
    for (const key of ['maxCalls', 'maxTokens'] as const) {
      const value = limits[key];
      if (!Number.isInteger(value) || value < 1) {
        throw new TypeError(`Expected \`${key}\` to be an integer from 1 up, got \`${String(value)}\` (${typeof value})`);
      }
    }
  }

  get calls(): number {
    return this.answeredCalls;
  }

  get tokens(): number {
    return this.usedTokens;
  }

  /**
   * Admit a call that asks for at most `maxTokens` output tokens (undefined: it does not say) with a
   * prompt of about `promptTokens`. While in flight it reserves its prompt and its output (a call that
   * names no max_tokens reserves UNBOUNDED_OUTPUT_RESERVE), at most what is left: so calls sent at once
   * can overrun the budget by at most one call's worth, however many there are.
   */
  admit(maxTokens: number | undefined, promptTokens = 0): Admission {
    const { maxCalls, maxTokens: tokenLimit } = this.limits;
    const calls = this.answeredCalls + this.inFlight;
    if (calls >= maxCalls) {
      return { ok: false, refusal: { budget: 'calls', limit: maxCalls, used: calls, message: `call budget used up: ${calls} of ${maxCalls} calls` } };
    }
    const committed = this.usedTokens + this.reserved;
    const remaining = tokenLimit - committed;
    const inFlight = this.reserved > 0 ? `, ${this.reserved} of them reserved by calls in flight` : '';
    if (remaining <= 0) {
      return { ok: false, refusal: { budget: 'tokens', limit: tokenLimit, used: committed, message: `token budget used up: ${committed} of ${tokenLimit} tokens${inFlight}` } };
    }
    if (maxTokens !== undefined && maxTokens > remaining) {
      return {
        ok: false,
        refusal: {
          budget: 'tokens',
          limit: tokenLimit,
          used: committed,
          message: `max_tokens ${maxTokens} exceeds the remaining token budget of ${remaining} (${committed} of ${tokenLimit} used${inFlight})`,
        },
      };
    }
    const ticket: BudgetTicket = { reservedTokens: Math.min(remaining, promptTokens + (maxTokens ?? UNBOUNDED_OUTPUT_RESERVE)), settled: false };
    this.inFlight += 1;
    this.reserved += ticket.reservedTokens;
    return { ok: true, ticket };
  }

  /**
   * Settle an admitted call: `answered` when the model gave an answer (it counts as a call), with the
   * tokens its usage reported. A call the model never answered is given back.
   */
  settle(ticket: BudgetTicket, outcome: { answered: boolean; tokens?: number | undefined }): void {
    if (ticket.settled) return;
    ticket.settled = true;
    this.inFlight -= 1;
    this.reserved -= ticket.reservedTokens;
    if (outcome.answered) {
      this.answeredCalls += 1;
      this.usedTokens += outcome.tokens ?? 0;
    }
  }
}
