// The kinds of failure an episode can end with: the one list the error mapping, the episode result
// schema and the CLI's `retry --kind` all take their values from. Imports nothing of the fleet, so
// queue contracts may use it.
import { z } from 'zod';

export const FAILURE_KINDS = ['infra', 'model', 'agent', 'verifier', 'invalid'] as const;

export const FailureKind = z.enum(FAILURE_KINDS);
export type FailureKind = z.infer<typeof FailureKind>;
