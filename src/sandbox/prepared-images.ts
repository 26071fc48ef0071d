// The folders every sandbox of a kind starts with (our tasks' /tests and workdir, the sandbox user's; a
// Harbor task's /logs; never a workspace: see set-up-phase.ts), made part of an image once per engine instead of
// written into each sandbox: the image plus one layer, committed from a created, never started
// container that got the files. A put costs the engine a re-exec of its archive helper (~50 ms of
// host CPU here, as much as an exec); creating from the prepared image costs what creating from its
// base does. At saturation that put was an eighth of an episode's CPU.
//
// The image is named by its base image's id and the files' digest, so the same files on the same base
// are made once per engine (one flight per process; two processes that race both commit, the later
// tag wins and the other image goes when unused). It keeps its base's config (ENTRYPOINT, USER, env,
// labels): the commit container is created with nothing of its own but the files, and with no labels,
// since a container inherits its image's labels and the fleet's would make every sandbox of it look
// like that container. The one thing it may add: a command `true` for a base with neither ENTRYPOINT
// nor CMD (the engine creates no container without one), which every sandbox replaces with its own.
import { createHash, randomBytes } from 'node:crypto';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { untilAborted } from '../deadlines/deadline.ts';
import { dockerCall, dockerStatusOf } from './docker-client.ts';
import { LABEL } from './labels.ts';
import { removeContainer } from './remove-container.ts';

/** Repository of prepared images; the tag is 24 hex digits of sha256(base image id, files). */
export const PREPARED_IMAGE_REPOSITORY = 'rollout-fleet/prepared';
/** How the name of every container fleet `prefix` commits a prepared image from starts (a hash of the prefix: any characters may be in it). */
export function prepareContainerPrefix(prefix: string): string {
  return `rf-prepare-${createHash('sha256').update(prefix).digest('hex').slice(0, 12)}-`;
}

const made = new WeakMap<Docker, Map<string, Promise<string>>>();

export interface PreparedImageOptions {
  /** The fleet's Redis key prefix: the image is labelled with it, so cleanup finds the fleet's own. */
  prefix: string;
  /** Deadline of each Docker call of the making. */
  timeoutMs: number;
  log: Logger;
}

/** The tag of the image `baseImageId` plus `files`. */
export function preparedImageTag(baseImageId: string, files: Buffer): string {
  const filesDigest = createHash('sha256').update(files).digest('hex');
  return `${PREPARED_IMAGE_REPOSITORY}:${createHash('sha256').update(`${baseImageId}\0${filesDigest}`).digest('hex').slice(0, 24)}`;
}

/**
 * The id of an image that is `baseImageId` with `files` (a tar for /) written over it: found on the
 * engine or made now, once per process and engine. Its sandboxes need no put of these files.
 */
export function preparedImage(docker: Docker, baseImageId: string, files: Buffer, opts: PreparedImageOptions, signal?: AbortSignal): Promise<string> {
  let known = made.get(docker);
  if (known === undefined) made.set(docker, (known = new Map()));
  const tag = preparedImageTag(baseImageId, files);
  let flight = known.get(tag);
  if (flight === undefined) {
    flight = findOrMake(docker, baseImageId, files, tag, opts);
    known.set(tag, flight);
    // A failure is not remembered: the next sandbox asks again.
    flight.catch(() => known.delete(tag));
  }
  // The making is shared: a caller that gives up leaves it to the others.
  return untilAborted(flight, signal);
}

/** Forget what this process knows of the prepared image `baseImageId` plus `files` (the engine said it is gone). */
export function forgetPreparedImage(docker: Docker, baseImageId: string, files: Buffer): void {
  made.get(docker)?.delete(preparedImageTag(baseImageId, files));
}

async function findOrMake(docker: Docker, baseImageId: string, files: Buffer, tag: string, opts: PreparedImageOptions): Promise<string> {
  const call = { timeoutMs: opts.timeoutMs };
  const found = await dockerCall('inspect image', call, () => docker.getImage(tag).inspect()).catch((err: unknown) => {
    if (dockerStatusOf(err) === 404) return undefined;
    throw err;
  });
  // Made from this base (a tag of the same name from another base cannot happen but by a collision).
  if (found !== undefined && found.Parent === baseImageId) return found.Id;
  const base = await dockerCall('inspect image', call, () => docker.getImage(baseImageId).inspect());
  const needsCommand = !(base.Config?.Entrypoint?.length) && !(base.Config?.Cmd?.length);
  const t0 = performance.now();
  const container = await dockerCall('create container', call, (abortSignal) => docker.createContainer({
    name: `${prepareContainerPrefix(opts.prefix)}${tag.slice(tag.indexOf(':') + 1)}-${randomBytes(3).toString('hex')}`,
    Image: baseImageId,
    ...(needsCommand && { Cmd: ['true'] }),
    NetworkDisabled: true,
    HostConfig: { NetworkMode: 'none' },
    abortSignal,
  } as Docker.ContainerCreateOptions & { abortSignal: AbortSignal }));
  try {
    await dockerCall('put archive', call, (abortSignal) => container.putArchive(files, { path: '/', abortSignal }));
    const [repo, version] = [tag.slice(0, tag.indexOf(':')), tag.slice(tag.indexOf(':') + 1)];
    // The body is the image's config over the container's: only the label is given, the rest is the container's, that is the base's.
    const committed = await dockerCall('commit container', call, (abortSignal) => container.commit({
      repo, tag: version, pause: false, abortSignal,
      _body: { Labels: { ...(base.Config?.Labels ?? {}), [LABEL.preparedPrefix]: opts.prefix } },
    } as object)) as { Id: string };
    opts.log.debug({ image: tag, base: baseImageId, ms: Math.round(performance.now() - t0) }, 'prepared image made');
    return committed.Id;
  } finally {
    await removeContainer(docker, container.id, call.timeoutMs).catch((err: unknown) =>
      opts.log.warn({ containerId: container.id, err: String(err) }, 'removing the container a prepared image was committed from failed'));
  }
}
