// Labels on every container and volume the fleet creates: they let the reaper and the tests find
// what belongs to which episode, worker and attempt, whatever process created it.
export const LABEL = {
  managed: 'rollout-fleet',
  /** The fleet's Redis key prefix: several fleets (or test runs) can share one engine. */
  fleet: 'rollout-fleet.fleet',
  episode: 'rollout-fleet.episode',
  batch: 'rollout-fleet.batch',
  worker: 'rollout-fleet.worker',
  attempt: 'rollout-fleet.attempt',
  /** On runtime volumes and their installer and probe containers: the generation id. */
  runtimeGeneration: 'rollout-fleet.runtime-generation',
  /** On runtime volumes: the fleet's Redis key prefix, whose lock guards the volume. */
  prefix: 'rollout-fleet.prefix',
  /** On the never-started containers that fill or inspect a runtime volume: `install` or `probe`. */
  runtimeRole: 'rollout-fleet.runtime-role',
  /**
   * On warm sandboxes a worker created ahead (its id): they carry no episode, batch or attempt. Which
   * episode claimed one is kept in Redis (sandboxClaimKey) for the reaper.
   */
  pool: 'rollout-fleet.pool',
  /**
   * On images built from a task's environment/. A container inherits its image's labels, so these
   * are never `managed` or `fleet` (the reaper would take every sandbox of a built image for its own).
   */
  envDigest: 'rollout-fleet.env-digest',
  /** On built environment images: the fleet's Redis key prefix that built them (pruning lists by it). */
  envPrefix: 'rollout-fleet.env-prefix',
  /** On prepared images (prepared-images.ts): the fleet's Redis key prefix that made them. Inherited by their sandboxes, harmlessly. */
  preparedPrefix: 'rollout-fleet.prepared-prefix',
  /** On built environment images: when the build started (ISO 8601). */
  envBuiltAt: 'rollout-fleet.env-built-at',
  /**
   * On every part of an episode's environment with task services (its namespace holder, sidecars, the
   * agent's container and the named volumes): one key, so the whole environment is removed as one.
   */
  environment: 'rollout-fleet.environment',
  /** On the parts of an environment with task services: `holder`, `service` or `main`. */
  environmentRole: 'rollout-fleet.environment-role',
  /** On a task service's container: its compose service name. */
  service: 'rollout-fleet.service',
} as const;

export interface SandboxOwner {
  fleet: string;
  episodeId: string;
  batchId: string;
  workerId: string;
  attempt: number;
}

/** The labels of a warm sandbox of `workerId`'s pool, before any episode claims it. */
export function pooledLabels(fleet: string, workerId: string): Record<string, string> {
  return { [LABEL.managed]: '1', [LABEL.fleet]: fleet, [LABEL.worker]: workerId, [LABEL.pool]: workerId };
}

export function sandboxLabels(owner: SandboxOwner): Record<string, string> {
  return {
    [LABEL.managed]: '1',
    [LABEL.fleet]: owner.fleet,
    [LABEL.episode]: owner.episodeId,
    [LABEL.batch]: owner.batchId,
    [LABEL.worker]: owner.workerId,
    [LABEL.attempt]: String(owner.attempt),
  };
}
