// The kinds of failure an episode can end with, and how often each is retried by default: the one
// list the error mapping, the episode result schema (its zod enum), the configuration and the CLI's
// `retry --kind` all take their values from. Imports nothing at all, so queue contracts and config
// may use it, and the CLI's help table without loading zod.

export const FAILURE_KINDS = ['infra', 'model', 'agent', 'verifier', 'invalid'] as const;
export type FailureKind = (typeof FAILURE_KINDS)[number];

export function isFailureKind(value: unknown): value is FailureKind {
  return (FAILURE_KINDS as readonly unknown[]).includes(value);
}

/**
 * Further attempts per failure kind (the worker's defaults; FLEET_INFRA_RETRIES and FLEET_MODEL_RETRIES
 * override). Agent, verifier and invalid-input failures are final results, never retried.
 */
export const DEFAULT_RETRY_BUDGETS = { infra: 2, model: 2 } as const satisfies Partial<Record<FailureKind, number>>;

/** The most further attempts one kind may be given: BullMQ's attempts ceiling of an episode job follows from it. */
export const MAX_RETRIES_PER_KIND = 20;
