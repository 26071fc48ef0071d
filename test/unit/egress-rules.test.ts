// The egress proxy's rules as pure logic: allowed_hosts entries (exact, *.suffix, case, trailing dot,
// ports, IPv6) and how a host matches them, FLEET_EGRESS_HOSTS and FLEET_NETWORK_CEILING with errors
// naming the field and the value, the grant of each phase under the ceiling, and the private-address
// guard's ranges. Nothing here opens a connection.
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, loadConfig } from '../../src/config/config.ts';
import { forbiddenAddress } from '../../src/egress/address-guard.ts';
import { formatHostRule, hostAllowed, parseEgressHosts, parseHostRule, parseHostRules, type HostRule } from '../../src/egress/host-rules.ts';
import { DEFAULT_NETWORK_CEILING, grantNetwork, grantPhase } from '../../src/egress/network-grant.ts';
import { egressEnv } from '../../src/episode/phase-egress.ts';
import { FleetError } from '../../src/errors/fleet-error.ts';
import { loadTask } from '../../src/tasks/load-task.ts';

const rules = (...entries: string[]): HostRule[] => {
  const { rules: parsed, problems } = parseHostRules(entries, 'allowed_hosts');
  expect(problems).toEqual([]);
  return parsed;
};

describe('allowed_hosts entries', () => {
  it('parse exact names, *.suffix, ports and IP addresses, normalized', () => {
    expect(parseHostRule('PyPI.org')).toEqual({ kind: 'exact', host: 'pypi.org' });
    expect(parseHostRule('pypi.org.')).toEqual({ kind: 'exact', host: 'pypi.org' });
    expect(parseHostRule('*.PythonHosted.org:443')).toEqual({ kind: 'suffix', host: 'pythonhosted.org', port: 443 });
    expect(parseHostRule('203.0.113.7:8080')).toEqual({ kind: 'exact', host: '203.0.113.7', port: 8080 });
    expect(parseHostRule('[2001:DB8::1]:443')).toEqual({ kind: 'exact', host: '2001:db8::1', port: 443 });
    expect(parseHostRule('2001:db8::1')).toEqual({ kind: 'exact', host: '2001:db8::1' });
    expect(formatHostRule(parseHostRule('*.Example.COM.:443') as HostRule)).toBe('*.example.com:443');
    expect(formatHostRule(parseHostRule('[::1]:80') as HostRule)).toBe('[::1]:80');
  });

  it('refuse what is not a host, naming the field, its index and the entry', () => {
    const { problems } = parseHostRules(['ok.example', 'https://pypi.org', 'a b', '*.com', 'x.example:0', 'x.example:99999', '*.*.example', 'foo.*.example', '*.203.0.113.7', '-bad.example', ''], 'verifier.allowed_hosts');
    expect(problems).toEqual([
      'verifier.allowed_hosts[1]: "https://pypi.org" is a URL or a path: write the host alone, as in pypi.org or pypi.org:443',
      'verifier.allowed_hosts[2]: "a b" is not a host name, *.suffix or IP address (optionally with :port)',
      'verifier.allowed_hosts[3]: "*.com" has a wildcard over a single label (write *.example.com, not *.com)',
      'verifier.allowed_hosts[4]: "x.example:0" has a port that is not a number from 1 to 65535',
      'verifier.allowed_hosts[5]: "x.example:99999" has a port that is not a number from 1 to 65535',
      'verifier.allowed_hosts[6]: "*.*.example" has a wildcard that does not open the name (write *.example.com)',
      'verifier.allowed_hosts[7]: "foo.*.example" has a wildcard that does not open the name (write *.example.com)',
      'verifier.allowed_hosts[8]: "*.203.0.113.7" has a wildcard over an IP address',
      'verifier.allowed_hosts[9]: "-bad.example" is not a host name, *.suffix or IP address (optionally with :port)',
      'verifier.allowed_hosts[10]: "" is not a host name, *.suffix or IP address (optionally with :port)',
    ]);
  });
});

describe('a host against the rules', () => {
  it('exact names match only themselves, in any case, with or without the trailing dot, on any port', () => {
    const r = rules('pypi.org');
    expect(hostAllowed(r, 'pypi.org', 443)).toBe(true);
    expect(hostAllowed(r, 'PYPI.ORG', 80)).toBe(true);
    expect(hostAllowed(r, 'pypi.org.', 8080)).toBe(true);
    expect(hostAllowed(r, 'files.pypi.org', 443)).toBe(false);
    expect(hostAllowed(r, 'pypi.org.evil.example', 443)).toBe(false);
    expect(hostAllowed(r, 'evilpypi.org', 443)).toBe(false);
  });

  it('*.suffix matches every name under it, not the suffix itself nor a name that only ends like it', () => {
    const r = rules('*.pythonhosted.org');
    expect(hostAllowed(r, 'files.pythonhosted.org', 443)).toBe(true);
    expect(hostAllowed(r, 'a.b.PythonHosted.org.', 443)).toBe(true);
    expect(hostAllowed(r, 'pythonhosted.org', 443)).toBe(false);
    expect(hostAllowed(r, 'evilpythonhosted.org', 443)).toBe(false);
    expect(hostAllowed(r, 'files.pythonhosted.org.evil.example', 443)).toBe(false);
  });

  it('a port in the rule allows only that port', () => {
    const r = rules('api.example.com:443', '*.cdn.example.com:8443');
    expect(hostAllowed(r, 'api.example.com', 443)).toBe(true);
    expect(hostAllowed(r, 'api.example.com', 80)).toBe(false);
    expect(hostAllowed(r, 'x.cdn.example.com', 8443)).toBe(true);
    expect(hostAllowed(r, 'x.cdn.example.com', 443)).toBe(false);
  });

  it('IP addresses match as written (IPv6 with or without brackets); no rule, no host', () => {
    const r = rules('203.0.113.7', '[2001:db8::1]:443');
    expect(hostAllowed(r, '203.0.113.7', 22)).toBe(true);
    expect(hostAllowed(r, '203.0.113.8', 22)).toBe(false);
    expect(hostAllowed(r, '[2001:DB8::1]', 443)).toBe(true);
    expect(hostAllowed(r, '2001:db8::1', 80)).toBe(false);
    expect(hostAllowed([], 'pypi.org', 443)).toBe(false);
  });
});

describe('the operator\'s settings', () => {
  it('FLEET_EGRESS_HOSTS maps names to addresses; a bad entry names the setting and the entry', () => {
    expect([...parseEgressHosts('allowed.example=127.0.0.1, Other.Example.=::1')]).toEqual([['allowed.example', '127.0.0.1'], ['other.example', '::1']]);
    expect([...parseEgressHosts(undefined)]).toEqual([]);
    expect(() => parseEgressHosts('allowed.example')).toThrow('FLEET_EGRESS_HOSTS: "allowed.example" must be name=address');
    expect(() => parseEgressHosts('allowed.example=not-an-ip')).toThrow('FLEET_EGRESS_HOSTS: "allowed.example=not-an-ip": "not-an-ip" is not an IP address');
    expect(() => parseEgressHosts('a b=127.0.0.1')).toThrow('FLEET_EGRESS_HOSTS: "a" must be name=address');
    expect(() => parseEgressHosts('bad_name!=127.0.0.1')).toThrow('FLEET_EGRESS_HOSTS: "bad_name!=127.0.0.1": "bad_name!" is not a host name');
    expect(() => parseEgressHosts('127.0.0.2=127.0.0.1')).toThrow('"127.0.0.2" is not a host name');
    expect(() => parseEgressHosts('x.example=127.0.0.1,X.example=127.0.0.2')).toThrow('x.example is mapped twice');
  });

  it('loadConfig names the field and the value of a bad ceiling or hosts map', () => {
    expect(loadConfig({}).FLEET_NETWORK_CEILING).toBe(DEFAULT_NETWORK_CEILING);
    expect(loadConfig({ FLEET_NETWORK_CEILING: 'public' }).FLEET_NETWORK_CEILING).toBe('public');
    const problems = (env: Record<string, string>) => {
      try {
        loadConfig(env);
      } catch (err) {
        expect(err).toBeInstanceOf(ConfigError);
        return (err as ConfigError).problems;
      }
      throw new Error('accepted');
    };
    expect(problems({ FLEET_NETWORK_CEILING: 'internet' })).toEqual(['FLEET_NETWORK_CEILING: one of no-network, allowlist, public (got "internet")']);
    expect(problems({ FLEET_EGRESS_HOSTS: 'allowed.example=nowhere' })).toEqual(['FLEET_EGRESS_HOSTS: "allowed.example=nowhere": "nowhere" is not an IP address (got "allowed.example=nowhere")']);
  });

  it('a phase gets what it asks for up to the ceiling, never refused; an allowlist without hosts is no network', () => {
    expect(grantPhase('public', [], 'public')).toEqual({ requested: 'public', applied: 'public' });
    expect(grantPhase('public', [], 'allowlist')).toEqual({ requested: 'public', applied: 'no-network' });
    expect(grantPhase('public', ['pypi.org'], 'allowlist')).toEqual({ requested: 'public', applied: 'allowlist', allowedHosts: ['pypi.org'] });
    expect(grantPhase('allowlist', ['pypi.org'], 'public')).toEqual({ requested: 'allowlist', applied: 'allowlist', allowedHosts: ['pypi.org'] });
    expect(grantPhase('allowlist', ['pypi.org'], 'no-network')).toEqual({ requested: 'allowlist', applied: 'no-network' });
    expect(grantPhase('allowlist', [], 'public')).toEqual({ requested: 'allowlist', applied: 'no-network' });
    expect(grantPhase('no-network', ['pypi.org'], 'public')).toEqual({ requested: 'no-network', applied: 'no-network' });
    // A job enqueued before allowed_hosts were kept: no hosts.
    expect(grantNetwork({ network: { agent: 'allowlist', verifier: 'public' } }, { ceiling: 'public' })).toEqual({
      agent: { requested: 'allowlist', applied: 'no-network' }, verifier: { requested: 'public', applied: 'public' },
    });
  });

  it('the phase\'s environment points every HTTP client at the forwarder and keeps loopback and the task\'s services direct', () => {
    const plain = egressEnv({ harbor: undefined } as never);
    expect(plain).toMatchObject({ HTTP_PROXY: 'http://127.0.0.1:8378', https_proxy: 'http://127.0.0.1:8378', NO_PROXY: 'localhost,127.0.0.1,::1' });
    const withServices = egressEnv({ harbor: { services: { sidecars: [{ name: 'api' }, { name: 'db' }] } } } as never);
    expect(withServices.no_proxy).toBe('localhost,127.0.0.1,::1,main,api,db');
  });
});

describe('the private-address guard', () => {
  it('refuses loopback, private, shared, link-local, multicast and reserved ranges, in every spelling', () => {
    for (const a of ['127.0.0.1', '127.255.0.9', '0.0.0.0', '10.1.2.3', '172.16.0.1', '172.31.255.255', '192.168.1.1', '100.64.0.1', '169.254.169.254',
      '224.0.0.1', '255.255.255.255', '198.18.0.1', '::1', '::', 'fe80::1', 'fc00::1', 'fd12:3456::1', 'ff02::1', '::ffff:127.0.0.1', '::ffff:7f00:1',
      '0:0:0:0:0:ffff:a00:1', '::127.0.0.1', '64:ff9b::a00:1', 'FE80::1%eth0']) {
      expect(forbiddenAddress(a), a).toBeDefined();
    }
  });

  it('lets public addresses through, and this host\'s own addresses never', () => {
    for (const a of ['1.1.1.1', '8.8.8.8', '151.101.0.223', '2606:4700:4700::1111', '::ffff:1.1.1.1']) expect(forbiddenAddress(a), a).toBeUndefined();
    for (const list of Object.values(os.networkInterfaces())) for (const i of list ?? []) expect(forbiddenAddress(i.address), i.address).toBeDefined();
    expect(forbiddenAddress('not-an-ip')).toBe('not an IP address');
  });
});

describe('a Harbor task\'s allowed_hosts at enqueue', () => {
  const FIXTURE = path.resolve(import.meta.dirname, '../fixtures/harbor-network/grader-allowlist');
  let scratch: string;
  beforeAll(async () => {
    scratch = await mkdtemp(path.join(os.tmpdir(), 'rf-egress-unit-'));
  });
  afterAll(async () => {
    await rm(scratch, { recursive: true, force: true });
  });

  it('are kept normalized per phase, the environment\'s as the default', async () => {
    const { spec } = await loadTask(FIXTURE);
    expect(spec.harbor?.network).toEqual({ agent: 'no-network', verifier: 'allowlist', allowedHosts: { agent: [], verifier: ['allowed.example'] } });
    const other = (await loadTask(path.resolve(FIXTURE, '../agent-allowlist'))).spec;
    expect(other.harbor?.network).toEqual({ agent: 'allowlist', verifier: 'no-network', allowedHosts: { agent: ['*.allowed.example'], verifier: ['*.allowed.example'] } });
  });

  it('a bad entry refuses the task, naming task.toml, the field and the entry', async () => {
    const dir = path.join(scratch, 'bad-hosts');
    await cp(FIXTURE, dir, { recursive: true });
    const toml = await readFile(path.join(dir, 'task.toml'), 'utf8');
    await writeFile(path.join(dir, 'task.toml'), toml.replace('allowed_hosts = ["Allowed.Example."]', 'allowed_hosts = ["ok.example", "http://x.example/path"]'));
    const err = await loadTask(dir).then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(FleetError);
    expect((err as Error).message).toContain('task.toml: verifier.allowed_hosts[1]: "http://x.example/path" is a URL or a path');
  });
});
