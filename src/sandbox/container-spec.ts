// What a sandbox is made of: the spec a session is opened with and the hardened options the engine
// creates its container from. No network, no capabilities, no privilege escalation, memory, CPU and
// pids limits, an init the sandbox user cannot signal, mounts read-only.
import { randomBytes } from 'node:crypto';
import type Docker from 'dockerode';
import { HARBOR_CAPABILITIES } from '../tasks/task-spec.ts';
import type { Limits } from '../tasks/task-spec.ts';
import { KEEP_ALIVE_PATH } from './keep-alive.ts';
import { LABEL, pooledLabels, sandboxLabels, type SandboxOwner } from './labels.ts';
import { enginePidsLimit, type SandboxRuntime } from './sandbox-runtime.ts';

/** A named volume mounted read-only into the sandbox (e.g. the runtime generation at /opt/rollout-fleet). */
export interface VolumeMount {
  /** Name of an existing volume; Docker would create a missing one empty, so pass only prepared ones. */
  volumeName: string;
  /** Absolute path inside the sandbox. */
  target: string;
}

export interface SessionSpec {
  image: string;
  workdir: string;
  /** diskMb is optional: a session opened outside an episode (a probe, a test) need not cap its disk. */
  limits: Omit<Limits, 'diskMb'> & Partial<Pick<Limits, 'diskMb'>>;
  owner: SandboxOwner;
  /** A warm sandbox of owner.workerId's pool: labelled as pooled, with no episode until one claims it. */
  pooled?: boolean;
  /** The engine's runtime it runs under (FLEET_SANDBOX_RUNTIME). @default the engine's default */
  runtime?: SandboxRuntime | undefined;
  /** Volumes mounted read-only. @default [] */
  mounts?: VolumeMount[];
  /** Host folders bind-mounted read-only at the same path (the model proxy's socket folder). @default [] */
  bindFolders?: string[];
  /**
   * A tar for / of the folders every sandbox of this kind starts with (our tasks' /tests and workdir, a
   * Harbor task's /logs; never a workspace, whose folders must stay renamable): made part of the image
   * the sandbox is created from, once per engine (prepared-images.ts), so no sandbox needs a put of it.
   * The session's imageId stays the image's own.
   */
  filesInImage?: Buffer;
  /**
   * A tar written at / into the created container before it starts (a seeded sandbox's workspace, a
   * separate verifier's /logs),
   * so its ENTRYPOINT already finds them: one engine call, where an exec costs three and a process.
   */
  filesBeforeStart?: Buffer;
  /**
   * A Harbor task's sandbox: the image's ENTRYPOINT and USER kept, the keep-alive its command, the
   * task's environment in the container's, and Docker's default capabilities minus those no task needs
   * (tasks expect a root shell). Every exec runs `bash -c`, as `user` (unset: the image's USER).
   */
  harbor?: {
    env: Record<string, string>;
    user?: string | undefined;
    /**
     * The keep-alive, the argument of the image's ENTRYPOINT: a program of a read-only mount (the
     * runtime generation's keep-alive), so a root agent cannot put its own in its place for the restart
     * before grading (the image's `sleep` is the agent's to replace).
     */
    keepAlive: readonly string[];
  };
  /**
   * Task services (task-services.ts): the container joins the holder's network namespace (loopback,
   * the services by name in its /etc/hosts) and mounts main's named volumes of the compose file.
   */
  services?: {
    key: string;
    holderId: string;
    mounts: { volumeName: string; target: string; readOnly: boolean }[];
  };
}

/** What a root agent of a Harbor task (and each of its task services) keeps of Docker's default capabilities (task-spec.ts). */
export { HARBOR_CAPABILITIES } from '../tasks/task-spec.ts';

/** The keep-alive of a Harbor sandbox (Harbor's is `sh -c "sleep infinity"`): the runtime generation's at `mountPath` (keep-alive.ts). */
export function harborKeepAlive(runtimeMountPath: string): string[] {
  return [`${runtimeMountPath}/${KEEP_ALIVE_PATH}`];
}

/** A fresh container name: the pool's worker or the episode and attempt, and a random tail. */
export function containerName(spec: SessionSpec): string {
  const { owner } = spec;
  return (spec.pooled ? `rf-pool-${owner.workerId}-${randomBytes(3).toString('hex')}` : `rf-${owner.episodeId}-a${owner.attempt}-${randomBytes(3).toString('hex')}`)
    .replace(/[^A-Za-z0-9_.-]/g, '_');
}

/**
 * The options the sandbox's container is created with, from image `imageId` (the id, so that a
 * re-tag in the meantime cannot change what runs). `storageOpt` caps the writable layer when the
 * engine supports it (see disk-quota.ts); undefined leaves it uncapped.
 */
export function hardenedCreateOptions(
  spec: SessionSpec,
  imageId: string,
  name: string,
  storageOpt: Record<string, string> | undefined,
): Docker.ContainerCreateOptions {
  const { limits, owner, harbor } = spec;
  const memoryBytes = limits.memoryMb * 1024 * 1024;
  const process = harbor
    // As Harbor runs it: the image's ENTRYPOINT (often a script starting the task's services) and
    // USER, the keep-alive as the command, the image's environment with the task's over it.
    ? { Cmd: [...harbor.keepAlive], Env: Object.entries(harbor.env).map(([k, v]) => `${k}=${v}`) }
    : {
      Cmd: ['sleep', '2147483647'],
      // The container's own processes (the engine's init, which reaps orphans, and its sleep) run as
      // root, without capabilities: the sandbox user cannot signal them, so no agent can stop its
      // sandbox or leave zombies holding its pids. Everything the session starts runs as SANDBOX_USER.
      User: '0:0',
      Env: ['PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin', 'HOME=/tmp'],
    };
  return {
    name,
    Image: imageId,
    ...process,
    WorkingDir: spec.workdir,
    Labels: spec.pooled ? pooledLabels(owner.fleet, owner.workerId) : {
      ...sandboxLabels(owner),
      ...(spec.services && { [LABEL.environment]: spec.services.key, [LABEL.environmentRole]: 'main' }),
    },
    // With task services, the holder's namespace: loopback only, as network none.
    ...(spec.services === undefined && { NetworkDisabled: true }),
    HostConfig: {
      NetworkMode: spec.services ? `container:${spec.services.holderId}` : 'none',
      CapDrop: ['ALL'],
      ...(harbor && { CapAdd: [...HARBOR_CAPABILITIES] }),
      SecurityOpt: ['no-new-privileges'],
      Memory: memoryBytes,
      MemorySwap: memoryBytes,
      NanoCpus: Math.round(limits.cpus * 1e9),
      PidsLimit: enginePidsLimit(limits.pids, spec.runtime),
      Init: true,
      ...(spec.runtime && { Runtime: spec.runtime.name }),
      ...(storageOpt && { StorageOpt: storageOpt }),
      AutoRemove: false,
      Mounts: [
        ...(spec.mounts ?? []).map((m) => ({
          Type: 'volume' as const, Source: m.volumeName, Target: m.target, ReadOnly: true, VolumeOptions: { NoCopy: true },
        })),
        // Same path inside and out: also right when the worker itself runs in a container.
        ...(spec.bindFolders ?? []).map((folder) => ({ Type: 'bind' as const, Source: folder, Target: folder, ReadOnly: true })),
        ...(spec.services?.mounts ?? []).map((m) => ({ Type: 'volume' as const, Source: m.volumeName, Target: m.target, ReadOnly: m.readOnly })),
      ],
    },
    // dockerode's MountSettings asks for every volume option (Labels, DriverConfig); the engine takes the ones given.
  } as Docker.ContainerCreateOptions;
}
