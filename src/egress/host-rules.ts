// The hosts a task allows a phase to reach through the egress proxy (`allowed_hosts` of task.toml):
// an exact name (`pypi.org`), a suffix (`*.pythonhosted.org`: every name under it, not the name
// itself) or an IP address, each optionally with `:port` (without one, any port). Names are compared
// as DNS compares them: case-insensitive, a trailing dot ignored. Also the operator's name overrides
// (FLEET_EGRESS_HOSTS), which the tests use to stand a loopback server in for an allowed host.
import net from 'node:net';

export interface HostRule {
  kind: 'exact' | 'suffix';
  /** Lower-case, no trailing dot; for a suffix, the part after `*.`; an IPv6 address without brackets. */
  host: string;
  /** Only this port; unset, any. */
  port?: number;
}

const LABEL = /^(?!-)[a-z0-9_-]{1,63}(?<!-)$/;

/** `name` as DNS compares it: lower-case, without the trailing dot, an IPv6 literal without brackets. */
export function normalizeHost(name: string): string {
  let h = name.trim().toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  if (h.endsWith('.') && net.isIP(h) === 0) h = h.slice(0, -1);
  return h;
}

/** A host name (labels of letters, digits, `-` and `_`) or an IP address, already normalized. */
export function isHostName(host: string): boolean {
  if (net.isIP(host) !== 0) return true;
  if (host.length === 0 || host.length > 253) return false;
  return host.split('.').every((label) => LABEL.test(label));
}

/** Split `host[:port]` (`[v6]:port` for IPv6); undefined port when none is written. */
function splitPort(text: string): { host: string; port?: string } {
  const t = text.trim();
  if (t.startsWith('[')) {
    const end = t.indexOf(']');
    if (end < 0) return { host: t };
    const rest = t.slice(end + 1);
    return rest.startsWith(':') ? { host: t.slice(0, end + 1), port: rest.slice(1) } : { host: t.slice(0, end + 1), ...(rest !== '' && { port: rest }) };
  }
  // A bare IPv6 address has several colons and no port.
  if (net.isIPv6(t)) return { host: t };
  const i = t.lastIndexOf(':');
  return i < 0 ? { host: t } : { host: t.slice(0, i), port: t.slice(i + 1) };
}

function parsePort(text: string): number | undefined {
  if (!/^\d{1,5}$/.test(text)) return undefined;
  const n = Number(text);
  return n >= 1 && n <= 65_535 ? n : undefined;
}

/** One entry of `allowed_hosts`, or a reason it is not one (said without the entry: the caller names it). */
export function parseHostRule(entry: string): HostRule | { problem: string } {
  if (entry.includes('/')) return { problem: 'is a URL or a path: write the host alone, as in pypi.org or pypi.org:443' };
  const { host: rawHost, port: rawPort } = splitPort(entry);
  let port: number | undefined;
  if (rawPort !== undefined) {
    port = parsePort(rawPort);
    if (port === undefined) return { problem: 'has a port that is not a number from 1 to 65535' };
  }
  const wildcard = rawHost.startsWith('*.');
  const host = normalizeHost(wildcard ? rawHost.slice(2) : rawHost);
  if (host.includes('*')) return { problem: 'has a wildcard that does not open the name (write *.example.com)' };
  if (!isHostName(host)) return { problem: 'is not a host name, *.suffix or IP address (optionally with :port)' };
  if (wildcard && net.isIP(host) !== 0) return { problem: 'has a wildcard over an IP address' };
  if (wildcard && !host.includes('.')) return { problem: 'has a wildcard over a single label (write *.example.com, not *.com)' };
  return { kind: wildcard ? 'suffix' : 'exact', host, ...(port !== undefined && { port }) };
}

/** Every entry parsed; the problems name `field[i]` and the entry (JSON-quoted). */
export function parseHostRules(entries: readonly string[], field: string): { rules: HostRule[]; problems: string[] } {
  const rules: HostRule[] = [];
  const problems: string[] = [];
  for (const [i, entry] of entries.entries()) {
    const r = parseHostRule(entry);
    if ('problem' in r) problems.push(`${field}[${i}]: ${JSON.stringify(entry.slice(0, 260))} ${r.problem}`);
    else rules.push(r);
  }
  return { rules, problems };
}

/** The entry as the fleet keeps it (normalized), e.g. `*.example.com:443`. */
export function formatHostRule(rule: HostRule): string {
  const host = rule.kind === 'suffix' ? `*.${rule.host}` : net.isIPv6(rule.host) ? `[${rule.host}]` : rule.host;
  return rule.port === undefined ? host : `${host}:${rule.port}`;
}

/** Whether `host:port` (host as the client wrote it) is allowed by one of `rules`. */
export function hostAllowed(rules: readonly HostRule[], host: string, port: number): boolean {
  const h = normalizeHost(host);
  return rules.some((r) => {
    if (r.port !== undefined && r.port !== port) return false;
    return r.kind === 'exact' ? h === r.host : h.endsWith(`.${r.host}`);
  });
}

/**
 * FLEET_EGRESS_HOSTS: `name=address[,name=address...]` (commas or whitespace between), each address
 * an IP literal. A name mapped here is connected to that address, whatever it resolves to, and the
 * private-address guard does not apply to it: the operator said so by name.
 */
export function parseEgressHosts(text: string | undefined, field = 'FLEET_EGRESS_HOSTS'): ReadonlyMap<string, string> {
  const map = new Map<string, string>();
  for (const item of (text ?? '').split(/[\s,]+/).filter((s) => s !== '')) {
    const eq = item.indexOf('=');
    const name = normalizeHost(eq < 0 ? item : item.slice(0, eq));
    const address = normalizeHost(eq < 0 ? '' : item.slice(eq + 1));
    const shown = JSON.stringify(item.slice(0, 260));
    if (eq < 0) throw new Error(`${field}: ${shown} must be name=address`);
    if (!isHostName(name) || net.isIP(name) !== 0) throw new Error(`${field}: ${shown}: ${JSON.stringify(name)} is not a host name`);
    if (net.isIP(address) === 0) throw new Error(`${field}: ${shown}: ${JSON.stringify(address)} is not an IP address`);
    if (map.has(name)) throw new Error(`${field}: ${shown}: ${name} is mapped twice`);
    map.set(name, address);
  }
  return map;
}
