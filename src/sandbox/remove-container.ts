// The removal of a container by id, shared by the session, the pool, the cleanup queue, the reaper and
// the runtime volumes: one way to end a container, which counts one already gone as removed.
import type Docker from 'dockerode';
import { dockerCall, dockerStatusOf } from './docker-client.ts';

/** 404 and 409 from a removal: the container is already gone or being removed. */
function isGone(err: unknown): boolean {
  const status = dockerStatusOf(err);
  return status === 404 || status === 409;
}

/** Force-remove a container by id; 404 and 409 (already gone or being removed) count as removed. */
export async function removeContainer(docker: Docker, containerId: string, timeoutMs: number): Promise<void> {
  try {
    await dockerCall('remove container', { timeoutMs }, (abortSignal) =>
      docker.getContainer(containerId).remove({ force: true, v: true, abortSignal }),
    );
  } catch (err) {
    if (isGone(err)) return;
    throw err;
  }
}
