// What network each phase of a Harbor task gets: what it asked for (`network_mode`, `allowed_hosts`
// of [agent], [verifier], else [environment]) capped by the operator's ceiling
// (FLEET_NETWORK_CEILING). A task asking more than the ceiling is never refused: it runs at the
// ceiling, and its result records both. Every grant other than no-network goes through the egress
// proxy outside the sandbox (the engine has no bridge): allowlist to the task's hosts, public to any
// host, both behind the private-address guard.
/** A phase's network, as task.toml spells it (the same enum as src/tasks/task-spec.ts's NetworkMode; this folder imports no other). */
export type NetworkMode = 'public' | 'no-network' | 'allowlist';
export const NETWORK_MODE_NAMES = ['no-network', 'allowlist', 'public'] as const satisfies readonly NetworkMode[];

export const NETWORK_RANK: Record<NetworkMode, number> = { 'no-network': 0, allowlist: 1, public: 2 };

/** FLEET_NETWORK_CEILING's default: task allowlists take effect, public asks run at the task's allowlist (else none). */
export const DEFAULT_NETWORK_CEILING: NetworkMode = 'allowlist';

/** The operator's side of every phase's network (FLEET_NETWORK_CEILING, FLEET_EGRESS_HOSTS). */
export interface NetworkSettings {
  ceiling: NetworkMode;
  /** Names connected to these addresses, past the private-address guard (tests: loopback stand-ins). */
  hostsMap: ReadonlyMap<string, string>;
}

export const DEFAULT_NETWORK: NetworkSettings = { ceiling: DEFAULT_NETWORK_CEILING, hostsMap: new Map() };

export type EgressPhase = 'agent' | 'verifier';

export interface PhaseGrant {
  requested: NetworkMode;
  /** What the phase runs with (granted). */
  applied: NetworkMode;
  /** With applied allowlist: the hosts (normalized entries of allowed_hosts). */
  allowedHosts?: string[];
}

/** `requested` capped by `ceiling`; an allowlist with no host is no network. */
export function grantPhase(requested: NetworkMode, hosts: readonly string[], ceiling: NetworkMode): PhaseGrant {
  let applied: NetworkMode = NETWORK_RANK[requested] <= NETWORK_RANK[ceiling] ? requested : ceiling;
  if (applied === 'allowlist' && hosts.length === 0) applied = 'no-network';
  return { requested, applied, ...(applied === 'allowlist' && { allowedHosts: [...hosts] }) };
}

/** Both phases' grants of a Harbor task under `settings`. */
export interface RequestedNetwork {
  network: { agent: NetworkMode; verifier: NetworkMode; allowedHosts?: { agent: string[]; verifier: string[] } | undefined };
}

export function grantNetwork(harbor: RequestedNetwork, settings: Pick<NetworkSettings, 'ceiling'>): Record<EgressPhase, PhaseGrant> {
  const hosts = harbor.network.allowedHosts;
  return {
    agent: grantPhase(harbor.network.agent, hosts?.agent ?? [], settings.ceiling),
    verifier: grantPhase(harbor.network.verifier, hosts?.verifier ?? [], settings.ceiling),
  };
}

/** The phase goes through the egress proxy. */
export const hasEgress = (grant: PhaseGrant | undefined): boolean => grant !== undefined && grant.applied !== 'no-network';
