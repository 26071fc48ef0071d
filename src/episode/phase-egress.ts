// A phase's network, when its grant is allowlist or public: the egress proxy started outside the
// sandbox on a socket in the episode's run folder (bind-mounted read-only into the sandbox), the
// forwarder started inside on a loopback port (the model forwarder's program, relaying to that
// socket instead), and the environment that points HTTP clients at it. Closed at the end of the
// phase: the socket goes, so a process the phase left behind has no way out either. A phase with
// no network gets none of this (no socket exists while it runs).
import path from 'node:path';
import type { Logger } from 'pino';
import { MODEL_FORWARDER_PATH } from '../agent/sandbox-programs.ts';
import { shellQuote } from '../files/shell-quote.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import { EGRESS_EVIDENCE_FILE, EGRESS_SOCKET_NAME, startEgressProxy, type EgressPolicy, type EgressProxy } from '../egress/egress-proxy.ts';
import { parseHostRules } from '../egress/host-rules.ts';
import { DEFAULT_NETWORK, grantNetwork, hasEgress, type EgressPhase, type NetworkSettings, type PhaseGrant } from '../egress/network-grant.ts';

/** The loopback port of the egress forwarder inside a sandbox (the model's is 8377). */
export const SANDBOX_EGRESS_PORT = 8378;
/** The forwarder gets this long to listen (node's start on a loaded host). */
const FORWARDER_READY_MS = 15_000;

/** Each phase's grant of a Harbor task under the worker's settings; undefined for the fleet's own tasks (always network none). */
export function phaseGrants(task: TaskSpec, settings: NetworkSettings | undefined): Record<EgressPhase, PhaseGrant> | undefined {
  return task.harbor && grantNetwork(task.harbor, settings ?? DEFAULT_NETWORK);
}

/** What HTTP clients read to use the proxy; NO_PROXY keeps loopback and the task's own services direct. */
export function egressEnv(task: TaskSpec, port = SANDBOX_EGRESS_PORT): Record<string, string> {
  const url = `http://127.0.0.1:${port}`;
  const services = task.harbor?.services;
  const direct = ['localhost', '127.0.0.1', '::1', ...(services ? ['main', ...services.sidecars.map((s) => s.name)] : [])].join(',');
  return { HTTP_PROXY: url, HTTPS_PROXY: url, http_proxy: url, https_proxy: url, NO_PROXY: direct, no_proxy: direct };
}

export interface PhaseEgress {
  proxy: EgressProxy;
  /** Merge into every exec of the phase. */
  env: Record<string, string>;
  close(): Promise<void>;
}

export interface PhaseEgressInput {
  phase: EgressPhase;
  grant: PhaseGrant | undefined;
  settings: NetworkSettings | undefined;
  task: TaskSpec;
  /** The sandbox the phase runs in (the agent's, or a separate verifier's). */
  session: SandboxSession;
  runtimeMountPath: string;
  /** The episode's run folder, bind-mounted into that sandbox. */
  runFolder: string | undefined;
  /** The attempt's evidence folder: decisions go to egress.jsonl there. */
  evidenceFolder: string;
  episodeId: string;
  log: Logger;
  signal: AbortSignal;
}

/** The phase's proxy and forwarder, or undefined when the phase has no network. */
export async function openPhaseEgress(input: PhaseEgressInput): Promise<PhaseEgress | undefined> {
  const { grant } = input;
  if (!hasEgress(grant) || grant === undefined) return undefined;
  if (input.runFolder === undefined) throw new Error(`the ${input.phase} phase has network ${grant.applied}, but its sandbox has no run folder mounted`);
  const policy: EgressPolicy = grant.applied === 'public'
    ? { mode: 'public' }
    : { mode: 'allowlist', rules: parseHostRules(grant.allowedHosts ?? [], `${input.phase}.allowed_hosts`).rules };
  const proxy = await startEgressProxy({
    socketPath: path.join(input.runFolder, EGRESS_SOCKET_NAME),
    phase: input.phase,
    policy,
    hostsMap: (input.settings ?? DEFAULT_NETWORK).hostsMap,
    evidenceFile: path.join(input.evidenceFolder, EGRESS_EVIDENCE_FILE),
    episodeId: input.episodeId,
    log: input.log,
  });
  try {
    const mount = input.runtimeMountPath;
    // As root: the socket is the worker's (0600 when it runs as root); the forwarder holds no secret.
    await input.session.startBackground(
      `exec ${mount}/bin/node ${mount}/${MODEL_FORWARDER_PATH} ${shellQuote(proxy.socketPath)} ${SANDBOX_EGRESS_PORT}`,
      { timeoutMs: FORWARDER_READY_MS, user: '0', signal: input.signal },
    );
  } catch (err) {
    await proxy.close();
    throw err;
  }
  return { proxy, env: egressEnv(input.task), close: () => proxy.close() };
}
