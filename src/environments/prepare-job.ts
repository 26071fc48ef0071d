// The prepare queues' contract: one queue per Docker engine (`prepare-<hash of the engine id>`), taken
// only by the workers of that engine, so `rollout-fleet prepare` reaches every host that has a live
// worker with one job per environment. Workers of the same engine share the queue; the build lock
// keeps it to one build per engine and content. Defined here, beside the builds, because the CLI
// (a producer) names the queues and may not import queues/.
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { FAILURE_KINDS } from '../errors/failure-kind.ts';
import { TaskSpec } from '../tasks/task-spec.ts';

const engineHash = (engineId: string) => createHash('sha256').update(engineId).digest('hex');

/** The prepare queue of one engine (its id has characters queue names must not hold). */
export function prepareQueueName(engineId: string): string {
  return `prepare-${engineHash(engineId).slice(0, 16)}`;
}

/**
 * A short name of an engine for people: engines of one machine (a second dockerd) may share the
 * daemon's ID and host name, and differ only in their data root, which the fleet's engine id hashes in.
 */
export function shortEngineName(engineId: string): string {
  return engineHash(engineId).slice(0, 8);
}

export const PREPARE_JOB = 'prepare-environment';

export const PrepareJob = z.object({
  task: TaskSpec,
  /** sha256 of the packed task in the task store. */
  taskDigest: z.string().regex(/^[0-9a-f]{64}$/, 'a sha256 in hex'),
});
export type PrepareJob = z.infer<typeof PrepareJob>;

export const PrepareResult = z.discriminatedUnion('status', [
  z.object({
    status: z.literal('ready'),
    image: z.string(),
    /** built: this job built it; pulled: this job pulled it from the registry (another host built it); already: the engine had it (or another caller built it meanwhile); docker_image: the task's own image is on the engine. */
    how: z.enum(['built', 'pulled', 'already', 'docker_image']),
    ms: z.number(),
    /** The manifest digest this job pushed it to the registry as (built, with FLEET_REGISTRY). */
    pushed: z.string().optional(),
    engineId: z.string(),
    workerId: z.string(),
  }),
  z.object({
    status: z.literal('failed'),
    kind: z.enum(FAILURE_KINDS),
    code: z.string(),
    message: z.string(),
    engineId: z.string(),
    workerId: z.string(),
  }),
]);
export type PrepareResult = z.infer<typeof PrepareResult>;

/** Jobs and their results are kept an hour (the command reads them as they end). */
export const prepareJobOptions = { removeOnComplete: { age: 3600 }, removeOnFail: { age: 3600 }, attempts: 1 } as const;
