// The egress proxy's guard against reaching the fleet's own side (SSRF): whatever host a phase may
// name, the proxy never connects to an address of loopback, a private, shared, link-local, multicast
// or reserved range, nor to any address of this host's own interfaces, where Redis, the API, the
// dashboard and the Docker socket's TCP twin may listen. Only a name the operator mapped by hand
// (FLEET_EGRESS_HOSTS) is exempt.
import net from 'node:net';
import os from 'node:os';

const V4 = [
  ['0.0.0.0', 8], ['10.0.0.0', 8], ['100.64.0.0', 10], ['127.0.0.0', 8], ['169.254.0.0', 16], ['172.16.0.0', 12],
  ['192.0.0.0', 24], ['192.0.2.0', 24], ['192.88.99.0', 24], ['192.168.0.0', 16], ['198.18.0.0', 15], ['198.51.100.0', 24],
  ['203.0.113.0', 24], ['224.0.0.0', 4], ['240.0.0.0', 4],
] as const;
const V6 = [
  ['::', 128], ['::1', 128], ['64:ff9b::', 96], ['64:ff9b:1::', 48], ['100::', 64], ['2001::', 32], ['2001:db8::', 32],
  ['2002::', 16], ['fc00::', 7], ['fe80::', 10], ['fec0::', 10], ['ff00::', 8],
] as const;

function fixedRanges(): net.BlockList {
  const list = new net.BlockList();
  for (const [a, bits] of V4) list.addSubnet(a, bits, 'ipv4');
  for (const [a, bits] of V6) list.addSubnet(a, bits, 'ipv6');
  return list;
}

const FIXED = fixedRanges();

/** The 16 bytes of an IPv6 address (a trailing dotted IPv4 part allowed). */
function v6Bytes(address: string): number[] | undefined {
  let text = address;
  const tail: number[] = [];
  const dotted = /(\d{1,3}(?:\.\d{1,3}){3})$/.exec(text);
  if (dotted) {
    tail.push(...dotted[1]!.split('.').map(Number));
    text = `${text.slice(0, dotted.index)}0:0`;
  }
  const [head, rest] = text.includes('::') ? text.split('::') as [string, string] : [text, undefined];
  const groups = (s: string) => (s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const left = groups(head);
  const right = rest === undefined ? [] : groups(rest);
  const all = rest === undefined ? left : [...left, ...new Array<number>(8 - left.length - right.length).fill(0), ...right];
  if (all.length !== 8 || all.some((g) => !Number.isInteger(g) || g < 0 || g > 0xffff)) return undefined;
  const bytes = all.flatMap((g) => [g >> 8, g & 255]);
  if (tail.length === 4) bytes.splice(12, 4, ...tail);
  return bytes;
}

/** The IPv4 address an IPv4-mapped (::ffff:a.b.c.d) or -compatible (::a.b.c.d) IPv6 address carries. */
function embeddedV4(address: string): string | undefined {
  const b = v6Bytes(address);
  if (b === undefined || b.slice(0, 10).some((x) => x !== 0)) return undefined;
  const marker = (b[10]! << 8) | b[11]!;
  if (marker !== 0xffff && marker !== 0) return undefined;
  return b.slice(12).join('.');
}

/** This host's own addresses, read afresh (interfaces come and go). */
function ownAddresses(): Set<string> {
  const own = new Set<string>();
  for (const list of Object.values(os.networkInterfaces())) for (const i of list ?? []) own.add(i.address.toLowerCase().split('%')[0]!);
  return own;
}

/** Why the proxy must not connect to `address` (an IP literal), or undefined when it may. */
export function forbiddenAddress(address: string): string | undefined {
  const a = address.toLowerCase().split('%')[0]!;
  const family = net.isIP(a);
  if (family === 0) return 'not an IP address';
  const v4 = family === 6 ? embeddedV4(a) : a;
  if (v4 !== undefined && net.isIPv4(v4)) {
    if (FIXED.check(v4, 'ipv4')) return `${address} is in a loopback, private, link-local or reserved range`;
  } else if (FIXED.check(a, 'ipv6')) {
    return `${address} is in a loopback, private, link-local or reserved range`;
  }
  if (ownAddresses().has(a) || (v4 !== undefined && ownAddresses().has(v4))) return `${address} is an address of this host`;
  return undefined;
}
