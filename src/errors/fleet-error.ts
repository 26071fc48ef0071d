// One error type for the whole fleet. Every failure carries a stable `code`; `outcomeOf` is the single
// exhaustive mapping from code to failure kind and to whether the episode may be retried.
import type { FailureKind } from './failure-kind.ts';

export type FleetErrorCode =
  /** The job payload on the queue does not match the episode schema. */
  | 'invalid_payload'
  /** A task folder, task.yaml or batch file is malformed. */
  | 'invalid_task'
  /** The task's image is not on the Docker engine (there is no registry to pull from). */
  | 'image_not_found'
  /** The task archive named by the job's digest is missing or does not match its digest. */
  | 'task_archive_missing'
  /** The Docker engine did not answer or refused a call. */
  | 'docker_unavailable'
  /** A Docker call passed its deadline. */
  | 'docker_timeout'
  /** Any other Docker error (container vanished, engine error). */
  | 'docker_error'
  /** A phase of the episode passed its reserve (a stalled engine, Redis or file system). */
  | 'phase_timeout'
  /** The sandbox stopped under the agent (the engine restarted, or it was killed from outside). */
  | 'sandbox_lost'
  /** Redis failed under a running episode. */
  | 'redis_error'
  /** The agent runtime generation could not be built or installed (inputs unreadable, install failed, wait too long). */
  | 'runtime_unavailable'
  /** An error nobody classified: treated as infrastructure, so it is retried, never scored. */
  | 'unexpected'
  /** The worker holding the episode was lost (stalled job, killed process). */
  | 'worker_lost'
  /** The model endpoint failed after the proxy's own retries. */
  | 'model_error'
  /** The batch's model endpoint (`model.endpoint`) is not in this worker's table: it goes back to the queue. */
  | 'unknown_endpoint'
  /**
   * The episode's policy grew staler than its batch's maxStaleness: the attempt is restarted from
   * scratch (not retried) up to its batch's maxStaleRestarts, then ends with this error.
   */
  | 'policy_stale'
  /** The agent crashed or broke its protocol. */
  | 'agent_crashed'
  /** The agent wrote more than its task's limits.diskMb into the sandbox and was stopped. */
  | 'disk_limit_exceeded'
  /** An artifact a separate verifier was to get is larger than the evidence snapshot's limit. */
  | 'artifact_too_large'
  /** The engine refused to restore an artifact into the verifier's container (a link out of it, say). */
  | 'artifact_invalid'
  /** The verifier exited with a code that is neither pass (0) nor fail (1). */
  | 'verifier_crashed'
  /** The verifier passed its timeout. */
  | 'verifier_timeout'
  /** A Harbor verifier wrote neither /logs/verifier/reward.json nor reward.txt. */
  | 'reward_file_missing'
  /** A Harbor reward file is empty. */
  | 'reward_file_empty'
  /** A Harbor reward file holds no number (reward.txt) or not an object of numbers (reward.json). */
  | 'reward_file_invalid'
  /** A Harbor task's [environment.healthcheck] did not pass before the agent: its environment is broken. */
  | 'healthcheck_failed'
  /** A step of a multi-step task: its workdir/setup.sh failed, so the step cannot be attempted (the task's fault). */
  | 'step_setup_failed'
  /** A task's environment/Dockerfile failed to build: the task's fault (the build log is in the error). */
  | 'environment_build_failed'
  /** A task's environment build passed its build_timeout_sec and was aborted. */
  | 'environment_build_timeout'
  /** The engine failed under an environment build (connection lost, server error, disk full): not the task's fault. */
  | 'environment_build_interrupted';

export interface Outcome {
  kind: FailureKind;
  /** Retry the episode (with backoff, under the kind's budget) rather than record a final result. */
  retry: boolean;
}

export function outcomeOf(code: FleetErrorCode): Outcome {
  switch (code) {
    case 'invalid_payload':
    case 'invalid_task':
    case 'image_not_found':
    case 'task_archive_missing':
    case 'healthcheck_failed':
    case 'step_setup_failed':
    case 'environment_build_failed':
    case 'environment_build_timeout':
      return { kind: 'invalid', retry: false };
    case 'docker_unavailable':
    case 'docker_timeout':
    case 'docker_error':
    case 'phase_timeout':
    case 'sandbox_lost':
    case 'redis_error':
    case 'runtime_unavailable':
    case 'unexpected':
    case 'worker_lost':
    case 'environment_build_interrupted':
      return { kind: 'infra', retry: true };
    case 'model_error':
    case 'unknown_endpoint':
      return { kind: 'model', retry: true };
    case 'policy_stale':
      return { kind: 'model', retry: false };
    case 'agent_crashed':
    case 'disk_limit_exceeded':
    case 'artifact_too_large':
    case 'artifact_invalid':
      return { kind: 'agent', retry: false };
    case 'verifier_crashed':
    case 'verifier_timeout':
    case 'reward_file_missing':
    case 'reward_file_empty':
    case 'reward_file_invalid':
      return { kind: 'verifier', retry: false };
    default: {
      const unreachable: never = code;
      throw new TypeError(`unknown fleet error code ${String(unreachable)}`);
    }
  }
}

export class FleetError extends Error {
  override readonly name = 'FleetError';
  constructor(
    readonly code: FleetErrorCode,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }

  get outcome(): Outcome {
    return outcomeOf(this.code);
  }
}

/** Any thrown value as a FleetError; unknown errors count as infrastructure errors (retried). */
export function toFleetError(err: unknown): FleetError {
  if (err instanceof FleetError) return err;
  const message = err instanceof Error ? err.message : String(err);
  return new FleetError('unexpected', message, { cause: err });
}
