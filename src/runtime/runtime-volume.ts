// One runtime generation's named volume on one Docker engine: its name and labels, whether it is
// ready (the marker written last is there), discarding a half-installed one, and installing: the
// archive streamed from the builder thread into a never-started container's mount, then the marker.
import type { Readable } from 'node:stream';
import type { Logger } from 'pino';
import { tarBuffer } from '../archive/tar-buffer.ts';
import { FleetError } from '../errors/fleet-error.ts';
import type { HeldLock } from '../redis/token-lock.ts';
import { dockerCall, type Docker } from '../sandbox/docker-client.ts';
import { LABEL } from '../sandbox/labels.ts';
import {
  containersUsingVolume,
  createVolume,
  inspectVolume,
  removeVolume,
  withVolumeContainer,
  type VolumeContainer,
  type VolumeContainerSpec,
  type VolumeInfo,
} from '../sandbox/volumes.ts';
import { removeContainer } from '../sandbox/sandbox-session.ts';
import { runtimeArchive, uploadRuntimeArchive } from './build-archive.ts';
import { READY_MARKER, RUNTIME_MOUNT_PATH, type RuntimeInputs } from './runtime-inputs.ts';
import type { HashedInputs } from './runtime-manifest.ts';

export interface VolumeDeps {
  docker: Docker;
  log: Logger;
  callTimeoutMs: number;
}

/**
 * The volume of a generation for a fleet: the prefix is part of the name because the install lock
 * lives in that fleet's Redis; two fleets sharing an engine must not fill one volume concurrently.
 */
export const runtimeVolumeName = (prefix: string, generationId: string) => `rf-runtime-${prefix}-${generationId}`;

export function runtimeVolumeLabels(prefix: string, generationId: string): Record<string, string> {
  return { [LABEL.managed]: '1', [LABEL.runtimeGeneration]: generationId, [LABEL.prefix]: prefix };
}

export type VolumeState =
  | { state: 'absent' }
  | { state: 'ready' | 'partial'; info: VolumeInfo };

/** One generation's volume for one fleet. */
export interface VolumeRef {
  volumeName: string;
  generationId: string;
  prefix: string;
}

function helperSpec(ref: VolumeRef, role: 'install' | 'probe', image: string): VolumeContainerSpec {
  return {
    volumeName: ref.volumeName,
    // Any path does: archive entries are relative to it, and the container never runs.
    mountPath: RUNTIME_MOUNT_PATH,
    image,
    labels: { ...runtimeVolumeLabels(ref.prefix, ref.generationId), [LABEL.runtimeRole]: role },
    readOnly: role === 'probe',
  };
}

/**
 * absent: no such volume. ready: ours (labels) with the ready marker. partial: anything else (being
 * installed, abandoned mid-install, or created by Docker itself for a mount of a missing volume).
 */
export async function volumeState(deps: VolumeDeps, ref: VolumeRef, helperImage: string): Promise<VolumeState> {
  const info = await inspectVolume(deps.docker, ref.volumeName, { timeoutMs: deps.callTimeoutMs });
  if (info === undefined) return { state: 'absent' };
  if (info.labels[LABEL.runtimeGeneration] !== ref.generationId) return { state: 'partial', info };
  // A probe racing a discard may find its container removed under it (404): not ready either way.
  const ready = await withVolumeContainer(deps, helperSpec(ref, 'probe', helperImage), (c) => c.exists(READY_MARKER));
  return { state: ready ? 'ready' : 'partial', info };
}

/**
 * Remove a volume that must not be used: first the installer and probe containers that still mount it
 * (left by a killed worker, or probing right now), then the volume. Sandboxes mounting it are not
 * touched: that is an error for an operator to look at.
 */
export async function discardVolume(deps: VolumeDeps, volumeName: string): Promise<void> {
  const call = { timeoutMs: deps.callTimeoutMs };
  for (let attempt = 1; attempt <= 5; attempt++) {
    const users = await containersUsingVolume(deps.docker, volumeName, call);
    const others = users.filter((u) => u.labels[LABEL.runtimeRole] === undefined);
    if (others.length > 0) {
      throw new FleetError(
        'runtime_unavailable',
        `runtime volume ${volumeName} is not fully installed but containers mount it: ${others.map((o) => o.id.slice(0, 12)).join(', ')}`,
      );
    }
    for (const helper of users) await removeContainer(deps.docker, helper.id, deps.callTimeoutMs);
    const result = await removeVolume(deps.docker, volumeName, call);
    if (result !== 'in-use') return;
  }
  throw new FleetError('runtime_unavailable', `runtime volume ${volumeName} stayed in use while being discarded`);
}

/** The ready marker as a one-entry tar: a few hundred bytes, so built here. */
async function markerArchive(generationId: string): Promise<Buffer> {
  return tarBuffer((pack) => {
    pack.entry({ name: READY_MARKER, mode: 0o644, mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' }, `${generationId}\n`);
  });
}

export interface InstallRequest {
  ref: VolumeRef;
  hashed: HashedInputs;
  inputs: RuntimeInputs;
  helperImage: string;
  /** The caller holds the generation's lock; the install stops if it is lost. */
  lock: HeldLock;
}

export interface Installed {
  /** Bytes sent to the engine: the archive and the marker. */
  bytesCopied: number;
  /** The volume's creation time, as the engine reports it. */
  createdAt: string;
}

/**
 * Fill a fresh volume: create it (labelled), stream the archive into a never-started container that
 * mounts it, and write the ready marker LAST, only while the lock is still ours. The archive goes from
 * the builder thread straight to the engine when the client allows (Unix socket or plain HTTP), else
 * through this thread as a stream.
 */
export async function installGeneration(deps: VolumeDeps, req: InstallRequest): Promise<Installed> {
  const { ref, hashed, lock } = req;
  const { volumeName } = ref;
  const id = hashed.generationId;
  const labels = runtimeVolumeLabels(ref.prefix, id);
  const call = { timeoutMs: deps.callTimeoutMs };
  await createVolume(deps.docker, volumeName, labels, call);
  return withVolumeContainer(deps, helperSpec(ref, 'install', req.helperImage), async (container) => {
    // A probe that raced a discard can make Docker create the volume itself, unlabelled: refuse it.
    const info = await inspectVolume(deps.docker, volumeName, call);
    if (info?.labels[LABEL.runtimeGeneration] !== id) {
      throw new FleetError('runtime_unavailable', `runtime volume ${volumeName} was recreated without its labels while being installed`);
    }
    const target = container.uploadTarget();
    const { bytes } = target
      ? await dockerCall('put archive into volume', { timeoutMs: deps.callTimeoutMs, signal: lock.signal }, (abortSignal) =>
          uploadRuntimeArchive(req.inputs, hashed, target, abortSignal),
        )
      : await relayArchive(container, req.inputs, hashed, lock.signal);
    if (!(await lock.stillHeld())) throw new FleetError('runtime_unavailable', `lost the install lock of ${volumeName} before its ready marker`);
    const marker = await markerArchive(id);
    await container.putArchive(marker, lock.signal);
    return { bytesCopied: bytes + marker.length, createdAt: info.createdAt };
  });
}

/** The archive built in the builder thread, streamed through this thread into the container. */
async function relayArchive(container: VolumeContainer, inputs: RuntimeInputs, hashed: HashedInputs, signal: AbortSignal) {
  const archive = runtimeArchive(inputs, hashed);
  let builderError: unknown;
  archive.summary.catch((err: unknown) => (builderError = err));
  try {
    await container.putArchive(archive.stream as Readable, signal);
  } catch (err) {
    // The builder's own error (an input changed or is unreadable) says more than the engine's.
    throw builderError ?? err;
  } finally {
    archive.stream.destroy();
  }
  return archive.summary;
}
