// A Harbor task's services (environment/docker-compose.yaml, read at enqueue by harbor-compose.ts), run
// by the fleet itself through the engine, without the compose CLI. One network namespace per episode:
// a small holder container (network none: loopback only, on an engine started with --bridge=none)
// whose /etc/hosts maps `main` and every service name to 127.0.0.1; the agent's container and every
// sidecar join it (NetworkMode container:<holder>) and see its /etc/hosts, so `http://api:8000` reaches
// the api sidecar and nothing outside the episode is reachable. Sidecars start in depends_on order;
// a service_healthy dependency is waited for by running its healthcheck with exec until it passes
// (bounded; failing is an error of kind invalid, never a reward). Every part (holder, sidecars, the
// agent's container, the named volumes) carries the episode's labels and one environment key, so
// removeEnvironment ends the whole of it from any one part, and the reaper finds each part by label.
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type Docker from 'dockerode';
import type { Logger } from 'pino';
import { FleetError } from '../errors/fleet-error.ts';
import { HARBOR_CAPABILITIES, type HarborServices, type HarborSidecar, type Limits } from '../tasks/task-spec.ts';
import { startOrder, healthcheckBoundSec } from '../tasks/harbor-compose.ts';
import { dockerCall, dockerStatusOf, engineDiskUsage } from './docker-client.ts';
import { LABEL, sandboxLabels, type SandboxOwner } from './labels.ts';
import { removeContainer } from './remove-container.ts';
import type { VolumeMount } from './container-spec.ts';
import { KEEP_ALIVE_PATH } from './keep-alive.ts';

export interface ServicesDeps {
  docker: Docker;
  log: Logger;
  callTimeoutMs: number;
}

/** What the agent's container is given to join its episode's services. */
export interface ServiceNetwork {
  /** The environment key every part is labelled with. */
  key: string;
  /** The holder whose network namespace (and /etc/hosts) the agent's container joins. */
  holderId: string;
  /** main's named-volume mounts of the compose file, read-write unless `:ro`. */
  mounts: { volumeName: string; target: string; readOnly: boolean }[];
  /** Each sidecar's container id, by service name (a separate verifier's collect hooks and artifacts). */
  sidecars: Record<string, string>;
  /** The episode's named volumes: the compose file's name and the engine's. */
  volumes: { name: string; volumeName: string }[];
}

export interface ServicesInput {
  owner: SandboxOwner;
  services: HarborServices;
  /** Each sidecar's image (an id or a reference the engine has), by service name. */
  images: ReadonlyMap<string, string>;
  /** The agent's image: the holder is created from it (it has nothing to run of its own). */
  mainImage: string;
  /** Every service's limits: the task's. */
  limits: Pick<Limits, 'memoryMb' | 'cpus' | 'pids'>;
  /** The runtime generation's mount: its keep-alive (keep-alive.ts) is the holder's. */
  runtime: VolumeMount;
}

/** The holder's own limits: it only keeps the namespace (admission counts them in an environment's cost). */
export const HOLDER_LIMITS = { memoryMb: 32, cpus: 0.1 } as const;
const HOLDER_MEMORY = HOLDER_LIMITS.memoryMb * 1024 * 1024;

function safeName(s: string): string {
  return s.replace(/[^A-Za-z0-9_.-]/g, '_');
}

/** The create options every sidecar shares: the main sandbox's hardening, in the holder's namespace. */
function sidecarOptions(svc: HarborSidecar, image: string, name: string, holderId: string, labels: Record<string, string>, limits: ServicesInput['limits'], volumeName: (v: string) => string): Docker.ContainerCreateOptions {
  const memory = limits.memoryMb * 1024 * 1024;
  return {
    name,
    Image: image,
    // Compose: an entrypoint given clears the image's CMD unless a command is given too.
    ...(svc.entrypoint !== undefined && { Entrypoint: svc.entrypoint, Cmd: svc.command ?? [] }),
    ...(svc.entrypoint === undefined && svc.command !== undefined && { Cmd: svc.command }),
    Env: Object.entries(svc.env).map(([k, v]) => `${k}=${v}`),
    ...(svc.workdir !== undefined && { WorkingDir: svc.workdir }),
    ...(svc.user !== undefined && { User: svc.user }),
    // expose: documentation only here (the engine refuses exposed ports in another container's namespace): every port of the namespace is reachable by every part of it.
    Labels: labels,
    HostConfig: {
      NetworkMode: `container:${holderId}`,
      CapDrop: ['ALL'],
      CapAdd: [...HARBOR_CAPABILITIES],
      SecurityOpt: ['no-new-privileges'],
      Privileged: false,
      Memory: memory,
      MemorySwap: memory,
      NanoCpus: Math.round(limits.cpus * 1e9),
      PidsLimit: limits.pids,
      Init: true,
      AutoRemove: false,
      Mounts: svc.mounts.map((m) => ({ Type: 'volume' as const, Source: volumeName(m.volume), Target: m.target, ReadOnly: m.readOnly })),
    },
  } as Docker.ContainerCreateOptions;
}

/**
 * Create the episode's namespace holder, volumes and sidecars, start the sidecars in depends_on order,
 * and wait for what main depends on. `onCreated` gets the holder's id and the environment's key as soon
 * as the holder exists (any part, or the key, ends the whole environment). Throws a FleetError with a code; what was made is left for the removal.
 */
export async function startTaskServices(deps: ServicesDeps, input: ServicesInput, onCreated: (containerId: string, environment: string) => void, signal: AbortSignal): Promise<ServiceNetwork> {
  const { docker, callTimeoutMs } = deps;
  const call = { timeoutMs: callTimeoutMs, signal };
  const { owner, services } = input;
  const key = safeName(`rf-${owner.episodeId}-a${owner.attempt}-${randomBytes(3).toString('hex')}`);
  const labels = (role: 'holder' | 'service' | 'main', extra: Record<string, string> = {}) => ({
    ...sandboxLabels(owner), [LABEL.environment]: key, [LABEL.environmentRole]: role, ...extra,
  });
  const volumeName = (v: string) => `${key}-v-${safeName(v)}`;

  const hosts = ['main', ...services.sidecars.map((s) => s.name)].map((n) => `${n}:127.0.0.1`);
  const holder = await dockerCall('create the services\' namespace holder', call, (abortSignal) => docker.createContainer({
    name: `${key}-ns`,
    Image: input.mainImage,
    Entrypoint: [`${input.runtime.target}/${KEEP_ALIVE_PATH}`],
    Cmd: [],
    User: '65534:65534',
    Hostname: 'main',
    Labels: labels('holder'),
    HostConfig: {
      NetworkMode: 'none',
      ExtraHosts: hosts,
      CapDrop: ['ALL'],
      SecurityOpt: ['no-new-privileges'],
      Memory: HOLDER_MEMORY,
      MemorySwap: HOLDER_MEMORY,
      NanoCpus: Math.round(HOLDER_LIMITS.cpus * 1e9),
      PidsLimit: 16,
      ReadonlyRootfs: true,
      Mounts: [{ Type: 'volume', Source: input.runtime.volumeName, Target: input.runtime.target, ReadOnly: true, VolumeOptions: { NoCopy: true } }],
    },
    abortSignal,
  } as unknown as Docker.ContainerCreateOptions & { abortSignal: AbortSignal }));
  onCreated(holder.id, key);
  await dockerCall('start the namespace holder', call, (abortSignal) => holder.start({ abortSignal }));

  for (const v of services.volumes) {
    await dockerCall('create a task volume', call, (abortSignal) =>
      docker.createVolume({ Name: volumeName(v), Labels: labels('service', { [LABEL.service]: v }), abortSignal } as Docker.VolumeCreateOptions & { abortSignal: AbortSignal }));
  }

  const containers = new Map<string, Docker.Container>();
  const waits = new Map<string, Promise<void>>();
  const byName = new Map(services.sidecars.map((s) => [s.name, s]));
  const ready = (dep: { service: string; condition: 'service_started' | 'service_healthy' }): Promise<void> => {
    const svc = byName.get(dep.service)!;
    if (dep.condition === 'service_started' || svc.healthcheck === undefined) return Promise.resolve();
    let w = waits.get(svc.name);
    if (w === undefined) {
      w = waitHealthy(deps, containers.get(svc.name)!, svc, signal);
      waits.set(svc.name, w);
    }
    return w;
  };
  for (const svc of startOrder(services.sidecars)) {
    // Its dependencies were started before it (start order); wait for the healthy ones.
    for (const d of svc.dependsOn) await ready(d);
    const image = input.images.get(svc.name);
    if (image === undefined) throw new FleetError('image_not_found', `task service ${svc.name}: no image was prepared for it`);
    const container = await dockerCall(`create task service ${svc.name}`, call, (abortSignal) => docker.createContainer({
      ...sidecarOptions(svc, image, `${key}-${safeName(svc.name)}`, holder.id, labels('service', { [LABEL.service]: svc.name }), input.limits, volumeName),
      abortSignal,
    } as Docker.ContainerCreateOptions & { abortSignal: AbortSignal }));
    containers.set(svc.name, container);
    await dockerCall(`start task service ${svc.name}`, call, (abortSignal) => container.start({ abortSignal }));
  }
  for (const d of services.main.dependsOn) await ready(d);
  return {
    key,
    holderId: holder.id,
    mounts: services.main.mounts.map((m) => ({ volumeName: volumeName(m.volume), target: m.target, readOnly: m.readOnly })),
    sidecars: Object.fromEntries([...containers].map(([name, c]) => [name, c.id])),
    volumes: services.volumes.map((v) => ({ name: v, volumeName: volumeName(v) })),
  };
}

/** The labels the agent's container of a services environment carries beside its own. */
export function mainServiceLabels(network: ServiceNetwork): Record<string, string> {
  return { [LABEL.environment]: network.key, [LABEL.environmentRole]: 'main' };
}

/**
 * Run a service's healthcheck with exec until it exits 0: every min(interval, 1 s) (Docker's first
 * check waits a whole interval; no task is the worse for an earlier one), each bounded by its timeout,
 * for at most its start period plus retries x (interval + timeout). A service that stopped, or the bound
 * passed, is `healthcheck_failed` (kind invalid), never a reward.
 */
async function waitHealthy(deps: ServicesDeps, container: Docker.Container, svc: HarborSidecar, signal: AbortSignal): Promise<void> {
  const check = svc.healthcheck!;
  const boundMs = healthcheckBoundSec(check) * 1000;
  const started = performance.now();
  const everyMs = Math.min(check.intervalSec * 1000, 1000);
  let last = 'no check ran';
  for (;;) {
    signal.throwIfAborted();
    const info = await dockerCall(`inspect task service ${svc.name}`, { timeoutMs: deps.callTimeoutMs, signal }, (abortSignal) => container.inspect({ abortSignal }));
    if (!info.State.Running) {
      throw new FleetError('healthcheck_failed', `task service ${svc.name} stopped (exit ${info.State.ExitCode}${info.State.OOMKilled ? ', OOM-killed' : ''}) before its healthcheck passed`);
    }
    const code = await execBounded(deps, container, check.test, check.timeoutSec * 1000, signal);
    if (code === 0) {
      deps.log.debug({ service: svc.name, ms: Math.round(performance.now() - started) }, 'task service healthy');
      return;
    }
    last = code === null ? `past its timeout of ${check.timeoutSec} s` : `exit ${code}`;
    if (performance.now() - started > boundMs) {
      throw new FleetError('healthcheck_failed', `task service ${svc.name}: its healthcheck did not pass within ${Math.round(boundMs / 1000)} s (start_period + retries x (interval + timeout); last: ${last})`);
    }
    // An abortable wait whose listener goes with it (a listener per poll on the set-up's signal would pile up).
    await sleep(everyMs, undefined, { signal });
  }
}

/**
 * Run `command` in the task service `containerId` (a separate verifier's collect hook), with bash when
 * its image has bash, else sh, as `user` (else the service's own): its exit code, or null past
 * `timeoutMs` (the process is left to end with the service, which stops right after).
 */
export async function execInService(deps: ServicesDeps, containerId: string, command: string, options: { user?: string; timeoutMs: number; signal: AbortSignal }): Promise<number | null> {
  const shell = 'if command -v bash >/dev/null 2>&1; then exec bash -c "$0"; fi; exec sh -c "$0"';
  return execBounded(deps, deps.docker.getContainer(containerId), ['sh', '-c', shell, command], options.timeoutMs, options.signal, options.user);
}

/**
 * The largest part of a services environment on disk, for the disk watch of an engine that cannot cap
 * it (each is held to the task's disk limit, as the sandbox is): the agent's container's writable
 * layer, each sidecar's, and each of the episode's named volumes (which the agent may share). Sizes
 * come from the engine (its walk of each layer and volume), never from a program inside.
 */
export async function largestPartBytes(deps: ServicesDeps, network: ServiceNetwork, main: { writableLayerBytes(signal: AbortSignal): Promise<number> }, signal: AbortSignal): Promise<{ bytes: number; part: string }> {
  const call = { timeoutMs: deps.callTimeoutMs, signal };
  const parts: Promise<{ bytes: number; part: string }>[] = [
    main.writableLayerBytes(signal).then((bytes) => ({ bytes, part: 'the agent\'s container' })),
    ...Object.entries(network.sidecars).map(async ([name, id]) => {
      const info = await dockerCall(`measure task service ${name}`, call, (abortSignal) =>
        deps.docker.getContainer(id).inspect({ size: true, abortSignal } as object) as Promise<Docker.ContainerInspectInfo & { SizeRw?: number }>);
      return { bytes: info.SizeRw ?? 0, part: `task service ${name}` };
    }),
  ];
  if (network.volumes.length > 0) {
    parts.push(engineDiskUsage<{ Volumes?: { Name: string; UsageData?: { Size?: number } }[] }>(deps.docker, 'measure the task volumes', call)
      .then((df) => {
        const mine = new Map(network.volumes.map((v) => [v.volumeName, v.name]));
        let largest = { bytes: 0, part: 'the task volumes' };
        for (const v of df.Volumes ?? []) {
          const name = mine.get(v.Name);
          if (name !== undefined && (v.UsageData?.Size ?? 0) > largest.bytes) largest = { bytes: v.UsageData!.Size!, part: `task volume ${name}` };
        }
        return largest;
      }));
  }
  const sizes = await Promise.all(parts);
  return sizes.reduce((a, b) => (b.bytes > a.bytes ? b : a));
}

/** Kill every task service of an environment (the agent's container is the caller's); one already stopped is fine. */
export async function killServices(deps: ServicesDeps, network: ServiceNetwork, signal: AbortSignal): Promise<void> {
  await Promise.all(Object.entries(network.sidecars).map(async ([name, id]) => {
    try {
      await dockerCall(`stop task service ${name}`, { timeoutMs: deps.callTimeoutMs, signal }, (abortSignal) => deps.docker.getContainer(id).kill({ abortSignal }));
    } catch (err) {
      // 409: not running; 404: gone.
      const status = dockerStatusOf(err);
      if (status !== 409 && status !== 404) throw err;
    }
  }));
}

/** Exit code of an exec-form command, or null past `timeoutMs` (left to end with the container). */
async function execBounded(deps: ServicesDeps, container: Docker.Container, cmd: readonly string[], timeoutMs: number, signal: AbortSignal, user?: string): Promise<number | null> {
  const call = { timeoutMs: deps.callTimeoutMs, signal };
  let exec: Docker.Exec;
  try {
    exec = await dockerCall('create healthcheck exec', call, (abortSignal) => container.exec({ Cmd: [...cmd], AttachStdout: false, AttachStderr: false, ...(user !== undefined && { User: user }), abortSignal } as never));
    await dockerCall('start healthcheck exec', call, (abortSignal) => exec.start({ Detach: true, abortSignal } as never));
  } catch (err) {
    // A program the image lacks is a failed check (the engine answers 404/500 at start), not an engine failure.
    const status = dockerStatusOf(err);
    if (status === 404 || status === 500 || status === 409) return 127;
    throw err;
  }
  const until = performance.now() + timeoutMs;
  for (let wait = 20; ; wait = Math.min(wait * 2, 200)) {
    const info = await dockerCall('inspect healthcheck exec', call, (abortSignal) => exec.inspect({ abortSignal } as object) as Promise<Docker.ExecInspectInfo>);
    if (!info.Running && info.ExitCode !== null) return info.ExitCode;
    if (performance.now() > until) return null;
    await sleep(wait, undefined, { signal });
  }
}

/**
 * Remove every part of the services environment `key`: the sidecars and the agent's container, then
 * the holder, then the named volumes. Parts already gone count as removed.
 */
export async function removeServiceEnvironment(docker: Docker, key: string, timeoutMs: number): Promise<void> {
  const call = { timeoutMs };
  const parts = await dockerCall('list an environment\'s containers', call, (abortSignal) =>
    docker.listContainers({ all: true, filters: { label: [`${LABEL.environment}=${key}`] }, abortSignal } as Docker.ContainerListOptions));
  const holders = parts.filter((c) => c.Labels[LABEL.environmentRole] === 'holder');
  await Promise.all(parts.filter((c) => !holders.includes(c)).map((c) => removeContainer(docker, c.Id, timeoutMs)));
  await Promise.all(holders.map((c) => removeContainer(docker, c.Id, timeoutMs)));
  const volumes = await dockerCall('list an environment\'s volumes', call, (abortSignal) =>
    docker.listVolumes({ filters: { label: [`${LABEL.environment}=${key}`] }, abortSignal } as object));
  await Promise.all((volumes.Volumes ?? []).map(async (v) => {
    try {
      await dockerCall('remove a task volume', call, (abortSignal) => docker.getVolume(v.Name).remove({ abortSignal }));
    } catch (err) {
      if (dockerStatusOf(err) !== 404) throw err;
    }
  }));
}

/** The environment key of a container, or undefined (a plain sandbox, or one already gone). */
export async function environmentKeyOf(docker: Docker, containerId: string, timeoutMs: number): Promise<string | undefined> {
  try {
    const info = await dockerCall('inspect container', { timeoutMs }, (abortSignal) => docker.getContainer(containerId).inspect({ abortSignal }));
    return info.Config.Labels?.[LABEL.environment];
  } catch (err) {
    if (dockerStatusOf(err) === 404) return undefined;
    throw err;
  }
}

/**
 * The end of every sidecar's output (stdout and stderr, interleaved as written, at most `capBytes`
 * each), by service name: kept as the episode's evidence at close.
 */
export async function serviceLogs(docker: Docker, key: string, capBytes: number, signal: AbortSignal, timeoutMs: number): Promise<Map<string, Buffer>> {
  const call = { timeoutMs, signal };
  const parts = await dockerCall('list an environment\'s services', call, (abortSignal) =>
    docker.listContainers({ all: true, filters: { label: [`${LABEL.environment}=${key}`, `${LABEL.environmentRole}=service`] }, abortSignal } as Docker.ContainerListOptions));
  const out = new Map<string, Buffer>();
  for (const c of parts) {
    const name = c.Labels[LABEL.service] ?? c.Id.slice(0, 12);
    const raw = await dockerCall(`read task service ${name}'s output`, call, (abortSignal) =>
      docker.getContainer(c.Id).logs({ stdout: true, stderr: true, follow: false, tail: 5000, abortSignal } as never) as unknown as Promise<Buffer>);
    const text = demuxFrames(Buffer.isBuffer(raw) ? raw : Buffer.from(String(raw)));
    out.set(name, text.length > capBytes ? text.subarray(text.length - capBytes) : text);
  }
  return out;
}

/** The payloads of the engine's multiplexed log frames (8-byte headers), in order; a TTY's raw bytes as they are. */
function demuxFrames(buf: Buffer): Buffer {
  const chunks: Buffer[] = [];
  let i = 0;
  while (i + 8 <= buf.length && buf[i]! <= 2 && buf[i + 1] === 0 && buf[i + 2] === 0 && buf[i + 3] === 0) {
    const size = buf.readUInt32BE(i + 4);
    chunks.push(buf.subarray(i + 8, i + 8 + size));
    i += 8 + size;
  }
  return i === 0 ? buf : Buffer.concat(chunks);
}
