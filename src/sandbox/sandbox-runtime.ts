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
 * Sentry's: measured here, about 57 host pids for an idle sandbox and 7 to 8 more per process started
 * in it. The engine's pids limit, which counts host pids, is widened by as much, so a sandbox of
 * `pids` processes fits and a fork bomb is still stopped near that many.
 */
export const GVISOR_HOST_PIDS_BASE = 64;
export const GVISOR_HOST_PIDS_PER_PROCESS = 8;

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
