// The kinds of failure an episode can end with: the one list the error mapping, the episode result
// schema (its zod enum), the retry budgets (src/errors/retry-budgets.ts) and the CLI's `retry --kind`
// all take their values from. Imports nothing at all, so queue contracts and config may use it, and
// the CLI's help table without loading zod.

export const FAILURE_KINDS = ['infra', 'model', 'agent', 'verifier', 'invalid'] as const;
export type FailureKind = (typeof FAILURE_KINDS)[number];

export function isFailureKind(value: unknown): value is FailureKind {
  return (FAILURE_KINDS as readonly unknown[]).includes(value);
}
