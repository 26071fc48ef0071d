// Thin processor of the `cleanup` queue: parse, remove the sandbox, let BullMQ retry on failure.
import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type Docker from 'dockerode';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { removeContainer } from '../../src/sandbox/sandbox-session.ts';
import { CleanupJob, type CleanupResult } from './contract.ts';

export function cleanupProcessor(docker: Docker) {
  return async (job: Job): Promise<CleanupResult> => {
    const parsed = CleanupJob.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(`invalid cleanup job: ${describeIssues(parsed.error, job.data).join('; ')}`);
    await removeContainer(docker, parsed.data.containerId, parsed.data.timeoutMs);
    return { removed: parsed.data.containerId };
  };
}
