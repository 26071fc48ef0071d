// The OCI runtime sandboxes run under (FLEET_SANDBOX_RUNTIME): unset, the engine's default (runc);
// e.g. `runsc`, gVisor, registered with the engine by .ci/setup-host.sh. Checked once at worker start
// against the engine's own list, so a name it does not know stops the worker before any episode.
import path from 'node:path';
import type Docker from 'dockerode';
import { ConfigError } from '../config/config.ts';
import { dockerCall, type CallOptions } from './docker-client.ts';

export interface SandboxRuntime {
  /** The engine's name of the runtime: HostConfig.Runtime of every sandbox. */
  name: string;
  /** Its program is gVisor's runsc: the engine's pids limit then counts the Sentry's host threads. */
  gvisor: boolean;
}

/**
 * gVisor (ptrace platform) runs each process of the sandbox on host threads of its own, beside the
 * Sentry's: measured here, 57 host pids for an idle sandbox and about 11 more per process running at
 * once (20 sleeps: 274), which stay after those processes end (310 once they were killed); the end of
 * the agent's turn (node, its threads, the verifier's shell) peaks at about 64 more (121 in a fresh
 * sandbox). The engine's pids limit, which counts host pids, is widened by as much, so a sandbox of
 * `pids` processes fits and a fork bomb is still stopped near that many. With 64 + 8 x pids (the first
 * measure, before the end of the turn ran node), a sandbox of 32 hit its 320 under load and runsc lost
 * it ("urpc method containerManager.WaitPID failed: EOF", the container exiting 2).
 */
export const GVISOR_HOST_PIDS_BASE = 160;
export const GVISOR_HOST_PIDS_PER_PROCESS = 12;

/** PidsLimit of a sandbox allowed `pids` processes, under `runtime`. */
export function enginePidsLimit(pids: number, runtime: SandboxRuntime | undefined): number {
  return runtime?.gvisor ? GVISOR_HOST_PIDS_BASE + GVISOR_HOST_PIDS_PER_PROCESS * pids : pids;
}

/** The runtime `name` as the engine lists it; throws a ConfigError naming the setting when it does not. */
export async function resolveSandboxRuntime(docker: Docker, name: string, opts: CallOptions): Promise<SandboxRuntime> {
  const info = await dockerCall('engine info', opts, (abortSignal) =>
    (docker.info as (opts: object) => Promise<{ Runtimes?: Record<string, { path?: string }> }>).call(docker, { abortSignal }));
  const runtimes = info.Runtimes ?? {};
  const known = Object.hasOwn(runtimes, name) ? runtimes[name] : undefined;
  if (known === undefined) {
    throw new ConfigError([
      `FLEET_SANDBOX_RUNTIME: the engine has no runtime ${JSON.stringify(name)} (it has ${Object.keys(runtimes).sort().join(', ') || 'none'}); register it in the engine's daemon.json "runtimes"`,
    ]);
  }
  return { name, gvisor: path.basename(known.path ?? '') === 'runsc' };
}
