// The image an episode's sandbox is created from, and what of it the task's commands need (workdir,
// user). The fleet's own tasks name an image the engine must have. A Harbor task names its
// `docker_image`, used when the engine has it (it is never pulled), and/or ships environment/ with a
// Dockerfile, built here once per engine and content (image-build.ts), or once for the fleet and
// pulled by the other hosts when a registry is set (FLEET_REGISTRY), and reused by every later
// episode, as runtime generations are. Task services built from a Dockerfile and a separate
// verifier's tests/ image go the same way.
import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import type { Logger } from 'pino';
import { FleetError } from '../errors/fleet-error.ts';
import { dockerCall, dockerStatusOf, type Docker } from '../sandbox/docker-client.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import { ensureEnvironmentImage, type EnvironmentImage } from './image-build.ts';

/** Bumped when the way an environment is built changes, so images built the old way are not reused. */
const BUILD_RECIPE = 'rollout-fleet/buildkit-v1';

export interface TaskImage {
  /** The reference the sandbox is created from. */
  image: string;
  /** Where it came from: the task's own image, a Harbor docker_image found on the engine, or built. */
  source: 'image' | 'docker_image' | 'built';
  /** The environment's content digest (built images). */
  digest?: string;
  /** The image's WORKDIR and USER, as its config says ('' when unset). */
  config: { workdir: string; user: string };
  /** The build, when this episode ran or waited for one. */
  build?: Pick<EnvironmentImage, 'built' | 'readyMs' | 'pulled' | 'pushed'>;
}

export interface TaskImageDeps {
  docker: Docker;
  redis: Redis;
  prefix: string;
  log: Logger;
  callTimeoutMs: number;
  /** FLEET_REGISTRY: built environments are shared through it (image-build.ts). Unset: each engine builds its own. */
  registry?: string | undefined;
}

/**
 * The content digest of a Harbor task's environment/ (or tests/, a separate verifier's build context):
 * names its built image on every engine.
 */
export async function environmentDigest(archive: TaskArchive, networkMode = 'none', part: 'environment' | 'tests' = 'environment'): Promise<{ digest: string; context: Buffer }> {
  const context = await archive.partAsContext(part);
  const digest = createHash('sha256').update(`${BUILD_RECIPE}\0network=${networkMode}\0`).update(context).digest('hex');
  return { digest, context };
}

async function inspectConfig(deps: TaskImageDeps, image: string, signal: AbortSignal): Promise<TaskImage['config'] | undefined> {
  try {
    const info = await dockerCall('inspect image', { timeoutMs: deps.callTimeoutMs, signal }, () => deps.docker.getImage(image).inspect());
    return { workdir: info.Config?.WorkingDir ?? '', user: info.Config?.User ?? '' };
  } catch (err) {
    if (dockerStatusOf(err) === 404) return undefined;
    throw err;
  }
}

/**
 * The image of `task` on this engine, built first when it is a Harbor environment the engine lacks.
 * `onBuildWait` is told when the episode starts waiting for a build (its status says so).
 */
export async function resolveTaskImage(
  deps: TaskImageDeps,
  task: TaskSpec,
  archive: TaskArchive,
  opts: { signal: AbortSignal; onBuildWait?: () => void },
): Promise<TaskImage> {
  const harbor = task.harbor;
  if (harbor === undefined) return { image: task.image, source: 'image', config: { workdir: '', user: '' } };
  if (harbor.dockerImage !== undefined) {
    const config = await inspectConfig(deps, harbor.dockerImage, opts.signal);
    if (config !== undefined) return { image: harbor.dockerImage, source: 'docker_image', config };
  }
  if (harbor.build === undefined) {
    throw new FleetError('image_not_found', `image ${harbor.dockerImage ?? '(none)'} is not on the Docker engine and task ${task.id} has no environment/Dockerfile to build it from (named images are never pulled, FLEET_REGISTRY shares only built ones: load the image first)`);
  }
  return buildPart(deps, task, archive, 'environment', harbor.build.timeoutSec, opts);
}

/** `part` of the task (environment/, or tests/ for a separate verifier) built on this engine, or the one already built. */
async function buildPart(deps: TaskImageDeps, task: TaskSpec, archive: TaskArchive, part: 'environment' | 'tests', timeoutSec: number, opts: { signal: AbortSignal; onBuildWait?: () => void }): Promise<TaskImage> {
  const { digest, context } = await environmentDigest(archive, 'none', part);
  const built = await ensureEnvironmentImage(
    deps,
    { context, digest, timeoutSec, labels: { 'rollout-fleet.task': task.id } },
    { signal: opts.signal, callTimeoutMs: deps.callTimeoutMs, ...(opts.onBuildWait && { onWait: () => opts.onBuildWait!() }) },
  );
  const config = await inspectConfig(deps, built.image, opts.signal);
  if (config === undefined) throw new FleetError('docker_error', `the ${part === 'tests' ? 'verifier' : 'environment'} image ${built.image} vanished from the engine right after it was ready`);
  return { image: built.image, source: 'built', digest, config, build: { built: built.built, readyMs: built.readyMs, ...(built.pulled && { pulled: true }), ...(built.pushed !== undefined && { pushed: built.pushed }) } };
}

/**
 * The image of a separate verifier: its docker_image when the engine has it, else tests/ built (with
 * tests/Dockerfile), else the agent's image, started afresh (Harbor's "copy of [environment]").
 */
export async function resolveVerifierImage(
  deps: TaskImageDeps,
  task: TaskSpec,
  archive: TaskArchive,
  agentImage: TaskImage,
  opts: { signal: AbortSignal; onBuildWait?: () => void },
): Promise<TaskImage | undefined> {
  const separate = task.harbor?.separateVerifier;
  if (separate === undefined) return undefined;
  if (separate.dockerImage !== undefined) {
    const config = await inspectConfig(deps, separate.dockerImage, opts.signal);
    if (config !== undefined) return { image: separate.dockerImage, source: 'docker_image', config };
  }
  if (separate.build !== undefined) return buildPart(deps, task, archive, 'tests', separate.build.timeoutSec, opts);
  if (separate.dockerImage !== undefined) {
    throw new FleetError('image_not_found', `the verifier's image ${separate.dockerImage} is not on the Docker engine and task ${task.id} has no tests/Dockerfile to build it from (named images are never pulled, FLEET_REGISTRY shares only built ones: load the image first)`);
  }
  return agentImage;
}

/** The workdir of a task's commands: the task's, else (a Harbor task without one) the image's WORKDIR, else /. */
export function effectiveWorkdir(task: TaskSpec, image: TaskImage): string {
  if (task.harbor?.workdirFromImage) return image.config.workdir.startsWith('/') ? image.config.workdir : '/';
  return task.workdir;
}

/**
 * The image of every task service (environment/docker-compose.yaml's sidecars) on this engine: an
 * `image:` the engine must have (named images are never pulled), the agent's image for `${MAIN_IMAGE_NAME}`, or
 * a `build:` context of the task folder, built and cached exactly as the main environment is (named by
 * the content digest of its folder and Dockerfile path; with FLEET_REGISTRY built once and pulled by the other hosts).
 */
export async function resolveServiceImages(
  deps: TaskImageDeps,
  task: TaskSpec,
  archive: TaskArchive,
  mainImage: string,
  opts: { signal: AbortSignal; onBuildWait?: () => void },
): Promise<Map<string, string>> {
  const images = new Map<string, string>();
  for (const svc of task.harbor?.services?.sidecars ?? []) {
    const from = svc.image;
    if (from.from === 'main') images.set(svc.name, mainImage);
    else if (from.from === 'image') {
      if (await inspectConfig(deps, from.reference, opts.signal) === undefined) {
        throw new FleetError('image_not_found', `task service ${svc.name}: image ${from.reference} is not on the Docker engine (named images are never pulled, FLEET_REGISTRY shares only built ones: load the image first, or give the service a build:)`);
      }
      images.set(svc.name, from.reference);
    } else {
      const context = await archive.partAsContext(from.context);
      const digest = createHash('sha256').update(`${BUILD_RECIPE}\0network=none\0dockerfile=${from.dockerfile}\0`).update(context).digest('hex');
      const built = await ensureEnvironmentImage(
        deps,
        { context, digest, timeoutSec: from.timeoutSec, dockerfile: from.dockerfile, labels: { 'rollout-fleet.task': task.id, 'rollout-fleet.task-service': svc.name } },
        { signal: opts.signal, callTimeoutMs: deps.callTimeoutMs, ...(opts.onBuildWait && { onWait: () => opts.onBuildWait!() }) },
      );
      images.set(svc.name, built.image);
    }
  }
  return images;
}

/**
 * The images a task needs beside its environment's, as set-up would make them: its task services'
 * (built ones cached as the environment is, image: ones looked for) and a separate verifier's, under
 * their build timeouts plus two minutes. For `prepare`, ahead of the batch; returns how many service images.
 */
export async function prepareOtherImages(deps: TaskImageDeps, task: TaskSpec, archive: TaskArchive, image: TaskImage): Promise<number> {
  const sidecars = task.harbor?.services?.sidecars ?? [];
  const buildSec = sidecars.reduce((n, svc) => n + (svc.image.from === 'build' ? svc.image.timeoutSec : 0), 0) + (task.harbor?.separateVerifier?.build?.timeoutSec ?? 0);
  const opts = { signal: AbortSignal.timeout((buildSec + 120) * 1000) };
  if (sidecars.length > 0) await resolveServiceImages(deps, task, archive, image.image, opts);
  await resolveVerifierImage(deps, task, archive, image, opts);
  return sidecars.length;
}
