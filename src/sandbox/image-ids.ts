// The image ids the sandboxes are created from, remembered per engine for a minute, so that a set-up
// does not ask the engine for the id of an image it asked about a moment ago.
import type Docker from 'dockerode';
import { FleetError } from '../errors/fleet-error.ts';
import { dockerCall, dockerStatusOf } from './docker-client.ts';

/** How long an image's id is used without asking the engine again (a re-tagged image is seen after this). */
const IMAGE_ID_TTL_MS = 60_000;
const imageIds = new WeakMap<Docker, Map<string, { id: string; at: number }>>();

/**
 * The image's id, asked of the engine once a minute per image, not per episode (one round trip less
 * on every set-up). A missing image is image_not_found: there is no registry to pull from.
 */
export async function imageOf(docker: Docker, image: string, call: { timeoutMs: number; signal?: AbortSignal | undefined }): Promise<{ Id: string }> {
  let known = imageIds.get(docker);
  if (known === undefined) imageIds.set(docker, (known = new Map()));
  const hit = known.get(image);
  if (hit !== undefined && Date.now() - hit.at < IMAGE_ID_TTL_MS) return { Id: hit.id };
  // Image.inspect takes no abort signal (it would become a query parameter); the race bounds it.
  const info = await dockerCall('inspect image', call, () => docker.getImage(image).inspect()).catch((err: unknown) => {
    if (dockerStatusOf(err) === 404) {
      throw new FleetError('image_not_found', `image ${image} not found on the Docker engine (there is no registry: build or import it first)`);
    }
    throw err;
  });
  known.set(image, { id: info.Id, at: Date.now() });
  return info;
}

/** Drop the remembered id of `image` (the engine said it is gone): the next set-up asks again. */
export function forgetImage(docker: Docker, image: string): void {
  imageIds.get(docker)?.delete(image);
}
