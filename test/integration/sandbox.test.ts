// The sandbox session on the real engine: hardened by default, exec deadlines that stop a whole
// process tree, capped output, idempotent removal.
import net from 'node:net';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FleetError } from '../../src/errors/fleet-error.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { SandboxSession } from '../../src/sandbox/sandbox-session.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import { buildDashImage, WRITABLE_PATH_DIR } from '../helpers/dash-image.ts';
import { docker, fleetContainers, silentLog } from '../helpers/fleet.ts';

const owner = { fleet: 'sandbox-test', episodeId: `sandbox-test-${process.pid}`, batchId: `sandbox-test-${process.pid}`, workerId: 'sandbox-test', attempt: 1 };
const spec = { image: DEFAULT_IMAGE, workdir: '/workspace', limits: { memoryMb: 64, cpus: 0.5, pids: 64 }, owner };
const deps = { docker, log: silentLog, callTimeoutMs: 30_000 };
const run = (s: SandboxSession, command: string, timeoutMs = 10_000, capBytes = 64 * 1024) => s.exec(command, { timeoutMs, capBytes });

describe('sandbox session', () => {
  let session: SandboxSession;

  beforeAll(async () => {
    session = await SandboxSession.open(deps, spec, () => undefined);
  });
  afterAll(async () => {
    await session?.remove();
  });

  it('runs as a non-root user with no capabilities, no privilege escalation and no network', async () => {
    const status = await run(session, 'id -u; grep -E "^(CapEff|NoNewPrivs)" /proc/self/status; tail -n +3 /proc/net/dev | cut -d: -f1');
    expect(status.exitCode).toBe(0);
    const lines = status.stdout.text.trim().split('\n').map((l) => l.replace(/\s+/g, ' ').trim());
    expect(lines).toEqual(['1000', 'CapEff: 0000000000000000', 'NoNewPrivs: 1', 'lo']);

    const info = await docker.getContainer(session.containerId).inspect();
    expect(info.HostConfig).toMatchObject({ NetworkMode: 'none', CapDrop: ['ALL'], SecurityOpt: ['no-new-privileges'], Memory: 64 * 1024 * 1024, PidsLimit: 64, NanoCpus: 5e8 });
    expect(info.Config.Labels).toMatchObject({ [LABEL.episode]: owner.episodeId, [LABEL.worker]: 'sandbox-test', [LABEL.attempt]: '1' });
    expect(info.Mounts).toEqual([]);
  });

  it('cannot reach a service on the host loopback, nor the Docker socket', async () => {
    const server = net.createServer((sock) => sock.end('hello\n'));
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as net.AddressInfo;
    try {
      // From the host the service answers; from the sandbox, 127.0.0.1 is the sandbox's own loopback.
      const fromHost = await new Promise<string>((resolve, reject) => {
        const c = net.connect(port, '127.0.0.1');
        c.once('data', (d) => { resolve(d.toString()); c.destroy(); });
        c.once('error', reject);
      });
      expect(fromHost).toBe('hello\n');
      const probe = await run(session, `nc -w 2 127.0.0.1 ${port} </dev/null; echo "nc=$?"; ls /var/run/docker.sock 2>&1`);
      expect(probe.stdout.text).not.toContain('hello');
      expect(probe.stdout.text).toMatch(/nc=[1-9]/);
      expect(probe.stdout.text + probe.stderr.text).toContain('No such file');
    } finally {
      server.close();
    }
  });

  it('sweeps every process the agent left (daemons, TERM-ignorers, a stopped one) in one exec, and says so when it cannot run', async () => {
    const own = await SandboxSession.open(deps, { ...spec, owner: { ...owner, episodeId: `${owner.episodeId}-sweep` }, limits: { memoryMb: 64, cpus: 0.5, pids: 24 } }, () => undefined);
    try {
      const count = 'n=0; for d in /proc/[0-9]*; do [ "${d#/proc/}" = "$$" ] && continue; u=$(awk "/^Uid:/{print \\$2}" $d/status 2>/dev/null); [ "$u" = 1000 ] && n=$((n+1)); done; echo $n';
      await run(own, 'for i in 1 2 3; do (trap "" TERM HUP; exec sleep 1000) & done; sleep 1000 & kill -STOP $!; (setsid sh -c "sleep 1000" &) ; echo started');
      // The count's own shell is left out; the glob is taken before awk runs.
      expect(Number((await run(own, count)).stdout.text.trim())).toBeGreaterThanOrEqual(5);
      expect(await own.sweepProcesses()).toEqual({ swept: true });
      expect(Number((await run(own, count)).stdout.text.trim())).toBe(0);
      // Asked to, the same exec copies a folder once nothing of the user's runs: a writer left behind
      // is stopped first, so the copy is what it had written. Past the cap there is no copy.
      await run(own, 'mkdir -p /tmp/ws/sub && echo a > /tmp/ws/sub/a.txt && (while :; do date >> /tmp/ws/log; done) & echo started');
      const copied = await own.sweepProcesses(undefined, { dir: '/tmp/ws', capBytes: 1 << 20 });
      expect(copied.swept).toBe(true);
      const names: string[] = [];
      const extract = tar.extract();
      extract.on('entry', (header, stream, next) => {
        names.push(header.name);
        stream.resume();
        stream.on('end', next);
      });
      await pipeline(Readable.from([copied.tar!]), extract);
      expect(names).toEqual(expect.arrayContaining(['ws/', 'ws/sub/', 'ws/sub/a.txt', 'ws/log']));
      expect(await own.sweepProcesses(undefined, { dir: '/tmp/ws', capBytes: 100 })).toEqual({ swept: true });
      // It needs one pid only (builtins), and says false when no exec can run at all: then the caller restarts.
      await docker.getContainer(own.containerId).kill();
      expect(await own.sweepProcesses()).toEqual({ swept: false });
    } finally {
      await own.remove();
    }
  });

  it('leaves nothing of the sandbox user running after its copy, even a daemon from a tar the agent planted', async () => {
    const image = `rollout-fleet/sandbox-test:dash-${process.pid}`;
    await buildDashImage(docker, image);
    const own = await SandboxSession.open(deps, { ...spec, image, owner: { ...owner, episodeId: `${owner.episodeId}-planted` } }, () => undefined);
    try {
      const plant = await run(own, [
        'mkdir -p /tmp/ws && echo a > /tmp/ws/a.txt',
        `printf '%s\\n' '#!/bin/sh' '(setsid sleep 1000 </dev/null >/dev/null 2>&1 &)' 'exec /bin/tar "$@"' > ${WRITABLE_PATH_DIR}/tar`,
        `chmod +x ${WRITABLE_PATH_DIR}/tar && command -v tar`,
      ].join(' && '));
      expect(plant.stdout.text.trim(), plant.stderr.text).toBe(`${WRITABLE_PATH_DIR}/tar`);
      const copied = await own.sweepProcesses(undefined, { dir: '/tmp/ws', capBytes: 1 << 20 });
      expect(copied.swept).toBe(true);
      expect(copied.tar).toBeDefined();
      const left = await run(own, 'n=0; for d in /proc/[0-9]*; do [ "${d#/proc/}" = "$$" ] && continue; grep -q "^Uid:[[:space:]]*1000" $d/status 2>/dev/null && n=$((n+1)); done; echo $n');
      expect(left.stdout.text.trim()).toBe('0');
    } finally {
      await own.remove();
      await docker.getImage(image).remove({ force: true }).catch(() => undefined);
    }
  });

  it('stops a process tree that ignores TERM when its timeout passes', async () => {
    const started = Date.now();
    const res = await run(session, "trap '' TERM; (trap '' TERM; sleep 1000) & sleep 1000; echo never", 1_000);
    expect(res.timedOut).toBe(true);
    expect(res.stdout.text).not.toContain('never');
    expect(Date.now() - started).toBeLessThan(10_000);
    const ps = await run(session, 'ps -o args | grep -cx "sleep 1000" || true');
    expect(ps.stdout.text.trim()).toBe('0');
  });

  it('caps captured output and counts what it dropped', async () => {
    const res = await run(session, 'head -c 20000000 /dev/zero | tr "\\0" a; echo; echo END', 30_000, 8 * 1024);
    expect(res.exitCode).toBe(0);
    expect(res.stdout.totalBytes).toBe(20_000_000 + 1 + 4);
    expect(res.stdout.truncated).toBe(true);
    expect(res.stdout.text.length).toBeLessThan(9 * 1024);
    expect(res.stdout.text.endsWith('END\n')).toBe(true);
  });

  it('removes its container, and a second remove is a no-op', async () => {
    const other = await SandboxSession.open(deps, { ...spec, owner: { ...owner, episodeId: `${owner.episodeId}-b` } }, () => undefined);
    await other.remove();
    await other.remove();
    expect(await fleetContainers('episode', `${owner.episodeId}-b`)).toEqual([]);
  });

  it('names a missing image as invalid input', async () => {
    const err = await SandboxSession.open(deps, { ...spec, image: 'rollout-fleet/absent:1' }, () => undefined).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(FleetError);
    expect(err).toMatchObject({ code: 'image_not_found', message: expect.stringContaining('image rollout-fleet/absent:1 not found') });
    expect((err as FleetError).outcome).toEqual({ kind: 'invalid', retry: false });
  });
});
