// Environment images shared between hosts through a registry (FLEET_REGISTRY, host:port): the host
// that builds an environment pushes it to <registry>/rollout-fleet/env:<tag> and records the pushed
// manifest's digest in Redis; another host pulls <registry>/rollout-fleet/env@<that digest> and tags
// it rollout-fleet/env:<tag> as if it had built it, so the rest of the fleet is unchanged. Only the
// local tag is kept on an engine (the registry's names are removed after a push or pull), so pruning
// by the local tag frees the image as before.
//
// Pulls and pushes go through the engine (POST /images/create, POST /images/<name>/push): the engine
// speaks to the registry, not this process. 127.0.0.0/8 registries are plain HTTP by the engine's
// default; any other one needs TLS or the engine's insecure-registries.
import type { IncomingMessage } from 'node:http';
import type { Redis } from 'ioredis';
import { envRegistryDigestKey } from '../redis/redis-keys.ts';
import { dockerCall, dockerStatusOf, type Docker } from '../sandbox/docker-client.ts';

/** A push or pull that did not work: the caller falls back to its own build (pull) or keeps its image unshared (push). */
// Never reaches an episode (every caller catches it), so not a FleetError.
export class RegistryError extends Error {
  override readonly name = 'RegistryError';
}

const MANIFEST_DIGEST = /^sha256:[0-9a-f]{64}$/;

/** The registry's repository of environment images: `<registry>/rollout-fleet/env`. */
export function registryRepository(registry: string, repository: string): string {
  return `${registry}/${repository}`;
}

/** The manifest digest recorded for `digest` (an environment's content digest), if some host pushed it. */
export async function recordedManifest(redis: Redis, prefix: string, registry: string, digest: string): Promise<string | undefined> {
  const value = await redis.get(envRegistryDigestKey(prefix, registry, digest));
  return value !== null && MANIFEST_DIGEST.test(value) ? value : undefined;
}

export async function recordManifest(redis: Redis, prefix: string, registry: string, digest: string, manifest: string): Promise<void> {
  await redis.set(envRegistryDigestKey(prefix, registry, digest), manifest);
}

type Modem = { dial: (o: object, cb: (err: unknown, data: unknown) => void) => void };

function dial(docker: Docker, opts: object): Promise<IncomingMessage> {
  return new Promise<IncomingMessage>((resolve, reject) => {
    (docker.modem as Modem).dial(opts, (err, data) => (err ? reject(err) : resolve(data as IncomingMessage)));
  });
}

/**
 * Read an engine's progress stream (one JSON object a line) to its end: the first error line is
 * thrown, and the `aux` objects are returned (a push's aux carries the pushed manifest's digest).
 */
async function readProgress(res: IncomingMessage, what: string): Promise<Record<string, unknown>[]> {
  const aux: Record<string, unknown>[] = [];
  let error: string | undefined;
  let pending = '';
  const onLine = (line: string) => {
    if (line.trim() === '') return;
    let entry: { error?: unknown; errorDetail?: { message?: unknown }; aux?: unknown };
    try {
      entry = JSON.parse(line) as typeof entry;
    } catch {
      return;
    }
    if (error === undefined && (typeof entry.error === 'string' || typeof entry.errorDetail?.message === 'string')) {
      error = typeof entry.errorDetail?.message === 'string' ? entry.errorDetail.message : String(entry.error);
    }
    if (entry.aux !== null && typeof entry.aux === 'object') aux.push(entry.aux as Record<string, unknown>);
  };
  try {
    for await (const chunk of res) {
      pending += (chunk as Buffer).toString('utf8');
      let nl: number;
      while ((nl = pending.indexOf('\n')) >= 0) {
        onLine(pending.slice(0, nl));
        pending = pending.slice(nl + 1);
      }
    }
    onLine(pending);
  } finally {
    res.destroy();
  }
  if (error !== undefined) throw new RegistryError(`${what}: ${error}`);
  return aux;
}

async function untag(docker: Docker, ref: string, timeoutMs: number): Promise<void> {
  // noprune: only the name goes; the image keeps its local tag.
  await dockerCall('untag image', { timeoutMs }, (abortSignal) => docker.getImage(ref).remove({ noprune: true, abortSignal } as object)).catch((err: unknown) => {
    if (dockerStatusOf(err) !== 404) throw err;
  });
}

function wrap(what: string, err: unknown): RegistryError {
  if (err instanceof RegistryError) return err;
  const detail = (err as { json?: { message?: string } }).json?.message ?? (err as Error).message ?? String(err);
  return new RegistryError(`${what}: ${detail}`, { cause: err });
}

/**
 * Push the local image `localRef` as `<registry>/<repository>:<tag>`; returns the pushed manifest's
 * digest. The registry's tag is removed from the engine afterwards (pushed or not).
 */
export async function pushImage(
  docker: Docker,
  localRef: string,
  target: { registry: string; repository: string; tag: string },
  opts: { timeoutMs: number; callTimeoutMs: number },
): Promise<string> {
  const remote = registryRepository(target.registry, target.repository);
  const what = `pushing ${localRef} to ${remote}:${target.tag}`;
  try {
    await dockerCall('tag image', { timeoutMs: opts.callTimeoutMs }, () => docker.getImage(localRef).tag({ repo: remote, tag: target.tag }));
  } catch (err) {
    throw wrap(what, err);
  }
  try {
    const signal = AbortSignal.timeout(opts.timeoutMs);
    const res = await dial(docker, {
      path: `/images/${remote}/push?`,
      method: 'POST',
      options: { tag: target.tag },
      // The engine wants the header even for a registry without auth.
      authconfig: {},
      abortSignal: signal,
      isStream: true,
      statusCodes: { 200: true, 404: 'no such image', 500: 'server error' },
    });
    const aux = await readProgress(res, what);
    const digest = aux.map((a) => a.Digest).find((d): d is string => typeof d === 'string' && MANIFEST_DIGEST.test(d));
    if (digest === undefined) throw new RegistryError(`${what}: the engine answered no manifest digest`);
    return digest;
  } catch (err) {
    throw wrap(what, err);
  } finally {
    await untag(docker, `${remote}:${target.tag}`, opts.callTimeoutMs).catch(() => undefined);
  }
}

/**
 * Pull `<registry>/<repository>@<manifest>` and tag it `localRef`, after checking its labels say it
 * is what was asked for (`expectLabels`): a record that points elsewhere is never used. The registry's
 * name is removed from the engine afterwards. Returns the image's id.
 */
export async function pullImage(
  docker: Docker,
  source: { registry: string; repository: string; manifest: string },
  localRef: { repo: string; tag: string },
  expectLabels: Record<string, string>,
  opts: { timeoutMs: number; callTimeoutMs: number },
): Promise<string> {
  if (!MANIFEST_DIGEST.test(source.manifest)) throw new RegistryError(`not a manifest digest: ${JSON.stringify(source.manifest)}`);
  const remote = registryRepository(source.registry, source.repository);
  const ref = `${remote}@${source.manifest}`;
  const what = `pulling ${ref}`;
  try {
    const res = await dial(docker, {
      path: '/images/create?',
      method: 'POST',
      options: { fromImage: remote, tag: source.manifest },
      authconfig: {},
      abortSignal: AbortSignal.timeout(opts.timeoutMs),
      isStream: true,
      statusCodes: { 200: true, 404: 'no such image', 500: 'server error' },
    });
    await readProgress(res, what);
    const info = await dockerCall('inspect image', { timeoutMs: opts.callTimeoutMs }, () => docker.getImage(ref).inspect());
    const labels = info.Config?.Labels ?? {};
    for (const [key, value] of Object.entries(expectLabels)) {
      if (labels[key] !== value) throw new RegistryError(`${what}: its label ${key} is ${JSON.stringify(labels[key] ?? null)}, not ${JSON.stringify(value)}`);
    }
    await dockerCall('tag image', { timeoutMs: opts.callTimeoutMs }, () => docker.getImage(info.Id).tag(localRef));
    return info.Id;
  } catch (err) {
    throw wrap(what, err);
  } finally {
    await untag(docker, ref, opts.callTimeoutMs).catch(() => undefined);
  }
}
