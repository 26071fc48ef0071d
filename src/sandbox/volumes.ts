// Named volumes and the never-started containers that fill or inspect them: a container that mounts a
// volume can take putArchive into it and answer whether a path exists, without running anything.
// Every call has a deadline.
import type { Readable } from 'node:stream';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import type { EngineAddress, UploadTarget } from './archive-upload.ts';
import { dockerCall, dockerStatusOf, type CallOptions } from './docker-client.ts';
import { removeContainer } from './sandbox-session.ts';

export interface VolumeInfo {
  name: string;
  labels: Record<string, string>;
  /** As the engine reports it (RFC 3339). */
  createdAt: string;
}

/** The volume, or undefined when the engine has none of that name. */
export async function inspectVolume(docker: Docker, name: string, call: CallOptions): Promise<VolumeInfo | undefined> {
  try {
    const info = await dockerCall('inspect volume', call, (abortSignal) => docker.getVolume(name).inspect({ abortSignal }));
    return { name: info.Name, labels: info.Labels ?? {}, createdAt: (info as { CreatedAt?: string }).CreatedAt ?? '' };
  } catch (err) {
    if (dockerStatusOf(err) === 404) return undefined;
    throw err;
  }
}

/** Create a volume (the local driver returns an existing one of that name unchanged). */
export async function createVolume(docker: Docker, name: string, labels: Record<string, string>, call: CallOptions): Promise<void> {
  await dockerCall('create volume', call, (abortSignal) =>
    docker.createVolume({ Name: name, Labels: labels, abortSignal } as Docker.VolumeCreateOptions & { abortSignal: AbortSignal }),
  );
}

/** Remove a volume: `in-use` when a container (running or not) still references it. */
export async function removeVolume(docker: Docker, name: string, call: CallOptions): Promise<'removed' | 'absent' | 'in-use'> {
  try {
    await dockerCall('remove volume', call, (abortSignal) => docker.getVolume(name).remove({ abortSignal }));
    return 'removed';
  } catch (err) {
    const status = dockerStatusOf(err);
    if (status === 404) return 'absent';
    if (status === 409) return 'in-use';
    throw err;
  }
}

/** Volumes carrying every one of `labels` (`key` or `key=value`). */
export async function listVolumes(docker: Docker, labels: string[], call: CallOptions): Promise<VolumeInfo[]> {
  const res = await dockerCall('list volumes', call, (abortSignal) =>
    docker.listVolumes({ filters: { label: labels }, abortSignal } as object),
  );
  return (res.Volumes ?? []).map((v) => ({ name: v.Name, labels: v.Labels ?? {}, createdAt: (v as { CreatedAt?: string }).CreatedAt ?? '' }));
}

/** Containers, running or not, that mount the volume, with their labels. */
export async function containersUsingVolume(docker: Docker, name: string, call: CallOptions): Promise<Array<{ id: string; labels: Record<string, string> }>> {
  const list = await dockerCall('list containers', call, (abortSignal) =>
    docker.listContainers({ all: true, filters: { volume: [name] }, abortSignal } as Docker.ContainerListOptions),
  );
  return list.map((c) => ({ id: c.Id, labels: c.Labels ?? {} }));
}

/** Ids of containers, running or not, carrying every one of `labels`. */
export async function containersLabelled(docker: Docker, labels: string[], call: CallOptions): Promise<string[]> {
  const list = await dockerCall('list containers', call, (abortSignal) =>
    docker.listContainers({ all: true, filters: { label: labels }, abortSignal } as Docker.ContainerListOptions),
  );
  return list.map((c) => c.Id);
}

export interface VolumeContainerSpec {
  volumeName: string;
  /** Where the container mounts the volume; archive paths are relative to it. */
  mountPath: string;
  /** Any image the engine has; the container is never started, so nothing of it runs. */
  image: string;
  labels: Record<string, string>;
  readOnly: boolean;
}

/** A created, never started container mounting one volume. */
export interface VolumeContainer {
  readonly id: string;
  /** Extract a tar (entry names relative to the mount path) into the volume. */
  putArchive(archive: Readable | Buffer, signal?: AbortSignal): Promise<void>;
  /** Whether `relPath` exists in the volume. */
  exists(relPath: string): Promise<boolean>;
  /**
   * Where another thread can PUT an archive into the volume itself (archive-upload.js), or undefined
   * when the client reaches the engine other than by Unix socket or plain HTTP.
   */
  uploadTarget(): UploadTarget | undefined;
}

/** The engine's address as the client reaches it, for code that cannot hold the client (another thread). */
export function engineAddress(docker: Docker): { address: EngineAddress; apiVersion?: string } | undefined {
  const modem = docker.modem as { socketPath?: unknown; host?: unknown; port?: unknown; protocol?: unknown; version?: unknown; headers?: Record<string, string> };
  if (modem.headers && Object.keys(modem.headers).length > 0) return undefined;
  const apiVersion = typeof modem.version === 'string' && modem.version !== '' ? { apiVersion: modem.version } : {};
  if (typeof modem.socketPath === 'string') return { address: { socketPath: modem.socketPath }, ...apiVersion };
  if (modem.protocol === 'http' && typeof modem.host === 'string') return { address: { host: modem.host, port: Number(modem.port ?? 2375) }, ...apiVersion };
  return undefined;
}

export interface VolumeContainerDeps {
  docker: Docker;
  log: Logger;
  callTimeoutMs: number;
}

/**
 * Create a never-started container mounting the volume (read-write or read-only), run `use` with it,
 * and remove the container whatever happens. A failed removal is logged, not thrown: the container
 * carries `labels`, so whoever repairs or removes the volume finds and removes it.
 */
export async function withVolumeContainer<T>(
  deps: VolumeContainerDeps,
  spec: VolumeContainerSpec,
  use: (container: VolumeContainer) => Promise<T>,
): Promise<T> {
  const { docker, callTimeoutMs } = deps;
  const call = { timeoutMs: callTimeoutMs };
  const created = await dockerCall('create volume container', call, (abortSignal) =>
    docker.createContainer({
      Image: spec.image,
      Cmd: ['true'],
      Labels: spec.labels,
      NetworkDisabled: true,
      HostConfig: {
        NetworkMode: 'none',
        Mounts: [{ Type: 'volume', Source: spec.volumeName, Target: spec.mountPath, ReadOnly: spec.readOnly, VolumeOptions: { NoCopy: true } }],
      },
      abortSignal,
    } as Docker.ContainerCreateOptions & { abortSignal: AbortSignal }),
  );
  const container: VolumeContainer = {
    id: created.id,
    async putArchive(archive, signal) {
      await dockerCall('put archive into volume', { timeoutMs: callTimeoutMs, signal }, (abortSignal) =>
        created.putArchive(archive as unknown as string, { path: spec.mountPath, abortSignal }),
      );
    },
    uploadTarget() {
      const engine = engineAddress(docker);
      return engine && { ...engine, containerId: created.id, path: spec.mountPath };
    },
    async exists(relPath) {
      try {
        const res = await dockerCall('stat path in volume', call, (abortSignal) =>
          created.infoArchive({ path: `${spec.mountPath}/${relPath}`, abortSignal }),
        );
        // dockerode hands back the (empty) HEAD response unread: drain it, or its socket stays busy.
        (res as Readable).resume();
        return true;
      } catch (err) {
        if (dockerStatusOf(err) === 404) return false;
        throw err;
      }
    },
  };
  try {
    return await use(container);
  } finally {
    await removeContainer(docker, created.id, callTimeoutMs).catch((err: unknown) =>
      deps.log.warn({ containerId: created.id, err: (err as Error).message }, 'removing a volume container failed'),
    );
  }
}
