// Thin processor of an engine's prepare queue: the environment of one task built on this worker's
// engine (or found there) as an episode's set-up would (with its task services' and a separate
// verifier's images), and the outcome returned as the job's value,
// failures included (their kind and code), so `rollout-fleet prepare` prints them per host.
import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { prepareOtherImages, resolveTaskImage } from '../../src/environments/task-environment.ts';
import { FleetError, outcomeOf } from '../../src/errors/fleet-error.ts';
import { engineId, type Docker } from '../../src/sandbox/docker-client.ts';
import { getTaskArchive } from '../../src/tasks/task-store.ts';
import { PREPARE_JOB, PrepareJob, type PrepareResult } from './contract.ts';

export interface PrepareProcessorDeps {
  docker: Docker;
  redis: Redis;
  prefix: string;
  log: Logger;
  workerId: string;
  callTimeoutMs: number;
  /** FLEET_REGISTRY: the environment is built once for the fleet and pulled by the other hosts. */
  registry?: string | undefined;
}

export function prepareProcessor(deps: PrepareProcessorDeps) {
  return async (job: Job): Promise<PrepareResult> => {
    if (job.name !== PREPARE_JOB) throw new UnrecoverableError(`unknown prepare job ${JSON.stringify(job.name)}`);
    const parsed = PrepareJob.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(`invalid prepare job: ${describeIssues(parsed.error, job.data).join('; ')}`);
    const { task, taskDigest } = parsed.data;
    const engine = await engineId(deps.docker, { timeoutMs: deps.callTimeoutMs });
    const started = performance.now();
    try {
      const archive = await getTaskArchive(deps.redis, deps.prefix, taskDigest);
      const timeoutSec = task.harbor?.build?.timeoutSec ?? 0;
      const imageDeps = { docker: deps.docker, redis: deps.redis, prefix: deps.prefix, log: deps.log, callTimeoutMs: deps.callTimeoutMs, registry: deps.registry };
      const image = await resolveTaskImage(
        imageDeps,
        task,
        archive,
        { signal: AbortSignal.timeout((timeoutSec + 120) * 1000) },
      );
      // Everything else set-up would build or look for: the task services' images, a separate verifier's.
      await prepareOtherImages(imageDeps, task, archive, image);
      const how = image.source === 'docker_image' ? 'docker_image' : image.build?.built ? 'built' : image.build?.pulled ? 'pulled' : 'already';
      return { status: 'ready', image: image.image, how, ms: Math.round(performance.now() - started), ...(image.build?.pushed !== undefined && { pushed: image.build.pushed }), engineId: engine, workerId: deps.workerId };
    } catch (err) {
      const fleet = err instanceof FleetError ? err : undefined;
      const code = fleet?.code ?? 'unexpected';
      const kind = fleet ? outcomeOf(fleet.code).kind : 'infra';
      deps.log.warn({ taskId: task.id, code, err: String(err) }, 'environment not prepared');
      return { status: 'failed', kind, code, message: (err as Error).message.split('\n')[0] ?? '', engineId: engine, workerId: deps.workerId };
    }
  };
}
