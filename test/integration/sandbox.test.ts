// The sandbox session on the real engine: hardened by default, exec deadlines that stop a whole
// process tree, capped output, idempotent removal.
import { mkdtemp } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { sandboxPrograms } from '../../src/agent/sandbox-programs.ts';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import { FleetError } from '../../src/errors/fleet-error.ts';
import { prepareRuntime, type RuntimeGeneration } from '../../src/runtime/prepare-runtime.ts';
import { defaultRuntimeInputs } from '../../src/runtime/runtime-inputs.ts';
import { LABEL } from '../../src/sandbox/labels.ts';
import { SandboxSession } from '../../src/sandbox/sandbox-session.ts';
import { CommandAgent } from '../../src/agent/command-agent.ts';
import type { TaskSpec } from '../../src/tasks/task-spec.ts';
import { SANDBOX_USER } from '../../src/sandbox/sandbox-user.ts';
import { DEFAULT_IMAGE } from '../../src/tasks/task-spec.ts';
import { buildDashImage, WRITABLE_PATH_DIR } from '../helpers/dash-image.ts';
import { SHARED_RUNTIME_CACHE, SHARED_RUNTIME_SCOPE, docker, fleetContainers, silentLog } from '../helpers/fleet.ts';

const owner = { fleet: 'sandbox-test', episodeId: `sandbox-test-${process.pid}`, batchId: `sandbox-test-${process.pid}`, workerId: 'sandbox-test', attempt: 1 };
const spec = { image: DEFAULT_IMAGE, workdir: '/workspace', limits: { memoryMb: 64, cpus: 0.5, pids: 64 }, owner };
const deps = { docker, log: silentLog, callTimeoutMs: 30_000 };
const run = (s: SandboxSession, command: string, timeoutMs = 10_000, capBytes = 64 * 1024) => s.exec(command, { timeoutMs, capBytes });

describe('sandbox session', () => {
  let session: SandboxSession;
  let redis: PrivateRedis;
  let runtime: RuntimeGeneration;
  // As an episode's own sandbox: the runtime generation mounted and /tests the sandbox user's.
  let endSpec: typeof spec & { mounts: RuntimeGeneration['mount'][]; filesBeforeStart: Buffer };
  let testsTar: Buffer;

  beforeAll(async () => {
    session = await SandboxSession.open(deps, spec, () => undefined);
    redis = await startPrivateRedis();
    const client = new Redis(redis.url, { maxRetriesPerRequest: null });
    try {
      const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-sandbox-test-'));
      const inputs = await defaultRuntimeInputs(await sandboxPrograms(dir), { cacheDir: SHARED_RUNTIME_CACHE });
      runtime = await prepareRuntime({ docker, redis: client, prefix: 'sandbox-test', log: silentLog, volumeScope: SHARED_RUNTIME_SCOPE }, inputs, { timeoutMs: 300_000 });
    } finally {
      await client.quit();
    }
    // /tests as an episode has it, and /workspace the sandbox user's (as a task's workspace put makes it).
    const folders = await tarBuffer((pack) => {
      for (const name of ['tests/', 'workspace/']) pack.entry({ name, type: 'directory', mode: 0o755, uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid });
    });
    endSpec = { ...spec, mounts: [runtime.mount], filesBeforeStart: folders };
    testsTar = await tarBuffer((pack) => {
      pack.entry({ name: 'tests/', type: 'directory', mode: 0o755 });
      pack.entry({ name: 'tests/check.txt', mode: 0o644 }, 'tests in\n');
    });
  });
  afterAll(async () => {
    await session?.remove();
    await redis?.stop();
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

  /** The end of the agent's turn in `own` with `tests` (a tar under tests/) and `command` as the verifier. */
  const endTurn = (own: SandboxSession, command: string, extra: { copyCapBytes?: number; tests?: Buffer } = {}) => own.endTurn({
    runtimeMountPath: runtime.mountPath, workdir: '/workspace', testsDir: '/tests', tests: [extra.tests ?? testsTar],
    command, rewardFile: false, verifierTimeoutMs: 10_000, outputCapBytes: 64 * 1024, copyCapBytes: extra.copyCapBytes ?? 1 << 20,
    signal: new AbortController().signal,
  });
  const names = async (tarBytes: Buffer) => {
    const out: string[] = [];
    const extract = tar.extract();
    extract.on('entry', (header, stream, next) => {
      out.push(header.name);
      stream.resume();
      stream.on('end', next);
    });
    await pipeline(Readable.from([tarBytes]), extract);
    return out;
  };

  it("ends the agent's turn in one exec: every process it left is gone first, the copy is what it wrote, and a sandbox that cannot run it says so", async () => {
    const own = await SandboxSession.open(deps, { ...endSpec, owner: { ...owner, episodeId: `${owner.episodeId}-sweep` }, limits: { memoryMb: 128, cpus: 0.5, pids: 24 } }, () => undefined);
    try {
      const count = 'n=0; for d in /proc/[0-9]*; do case "${d#/proc/}" in "$$"|"$PPID") continue;; esac; u=$(awk "/^Uid:/{print \\$2}" $d/status 2>/dev/null); [ "$u" = 1000 ] && n=$((n+1)); done; echo $n';
      await run(own, 'for i in 1 2 3; do (trap "" TERM HUP; exec sleep 1000) & done; sleep 1000 & kill -STOP $!; (setsid sh -c "sleep 1000" &) ; echo started');
      // A writer left behind is stopped before the copy, so the copy is what it had written.
      await run(own, 'mkdir -p /workspace/sub && echo a > /workspace/sub/a.txt && (while :; do date >> /workspace/log; done) & echo started');
      // The count's own shell and its parent (the end-of-turn program, for the verifier) are left out;
      // the glob is taken before awk runs.
      expect(Number((await run(own, count)).stdout.text.trim())).toBeGreaterThanOrEqual(6);
      const ended = await endTurn(own, `${count}; cat /tests/check.txt`);
      expect(ended.outcome).toBe('verified');
      if (ended.outcome !== 'verified') return;
      // The verifier saw none of the agent's processes, and the tests.
      expect(ended.verifyRun.stdout.text.trim().split('\n')).toEqual(['0', 'tests in']);
      expect(await names(ended.workspaceTar!)).toEqual(expect.arrayContaining(['workspace/', 'workspace/sub/', 'workspace/sub/a.txt', 'workspace/log']));
      const log = (await run(own, 'wc -c < /workspace/log')).stdout.text.trim();
      expect(Number(log)).toBeGreaterThan(0);
      // Past the cap there is no copy (close asks the engine), and the verifier still runs.
      const capped = await endTurn(own, 'true', { copyCapBytes: 100 });
      expect(capped).toMatchObject({ outcome: 'verified', verifyRun: { exitCode: 0 } });
      expect(capped.outcome === 'verified' && capped.workspaceTar).toBeFalsy();
      // It needs one pid only until the sweep is done (builtins), and says so when no exec can run at all: then the caller restarts.
      await docker.getContainer(own.containerId).kill();
      expect(await endTurn(own, 'true')).toEqual({ outcome: 'not-swept' });
    } finally {
      await own.remove();
    }
  });

  it("runs nothing of the image's PATH: a planted tar, head, cat or node in a folder on it starts nothing", async () => {
    const image = `rollout-fleet/sandbox-test:dash-${process.pid}`;
    await buildDashImage(docker, image);
    const own = await SandboxSession.open(deps, { ...endSpec, image, owner: { ...owner, episodeId: `${owner.episodeId}-planted` } }, () => undefined);
    try {
      const plant = await run(own, [
        'mkdir -p /workspace && echo a > /workspace/a.txt',
        ...['tar', 'head', 'cat', 'node'].map((tool) => `printf '%s\\n' '#!/bin/sh' 'echo planted > /tmp/planted-${tool}' '(setsid sleep 1000 </dev/null >/dev/null 2>&1 &)' > ${WRITABLE_PATH_DIR}/${tool} && chmod +x ${WRITABLE_PATH_DIR}/${tool}`),
        'command -v tar',
      ].join(' && '));
      expect(plant.stdout.text.trim(), plant.stderr.text).toBe(`${WRITABLE_PATH_DIR}/tar`);
      const ended = await endTurn(own, 'ls /tmp; echo verified');
      expect(ended.outcome).toBe('verified');
      if (ended.outcome !== 'verified') return;
      expect(ended.verifyRun.stdout.text).not.toContain('planted');
      expect(await names(ended.workspaceTar!)).toEqual(['workspace/', 'workspace/a.txt']);
      const left = await run(own, 'ls /tmp; n=0; for d in /proc/[0-9]*; do [ "${d#/proc/}" = "$$" ] && continue; grep -q "^Uid:[[:space:]]*1000" $d/status 2>/dev/null && n=$((n+1)); done; echo $n');
      expect(left.stdout.text).not.toContain('planted');
      expect(left.stdout.text.trim().split('\n').at(-1)).toBe('0');
    } finally {
      await own.remove();
      await docker.getImage(image).remove({ force: true }).catch(() => undefined);
    }
  });

  describe('attacks on the end of the turn', () => {
    /** A sandbox of its own, as an episode's: /workspace and /tests the sandbox user's. */
    const own = (name: string) => SandboxSession.open(deps, { ...endSpec, owner: { ...owner, episodeId: `${owner.episodeId}-${name}` }, limits: { memoryMb: 128, cpus: 0.5, pids: 64 } }, () => undefined);
    // Every frame the program may write, forged: a whole workspace, a reward of 1, tests in, a failure.
    const frame = (type: string, payload: string) => {
      const body = Buffer.from(payload);
      const head = Buffer.alloc(5);
      head[0] = type.charCodeAt(0);
      head.writeUInt32BE(body.length, 1);
      return Buffer.concat([head, body]);
    };
    const forged = Buffer.concat([
      frame('w', '{"whole":true,"bytes":1}'), frame('R', `{"json":"${Buffer.from('{"reward":1}').toString('base64')}"}`),
      frame('T', '{"ok":true}'), frame('S', ''), frame('F', '{"why":"forged"}'), Buffer.from([0x4f, 0xff, 0xff, 0xff, 0xff]),
    ]);

    it('keeps fake frames the agent left in a file the verifier prints as the verifier\'s output: its exit code still decides', async () => {
      const s = await own('fake-frames');
      try {
        await s.putArchive(await tarBuffer((pack) => pack.entry({ name: 'workspace/frames.bin', mode: 0o644, uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid }, forged)), '/');
        const ended = await endTurn(s, 'cat frames.bin; cat frames.bin >&2; exit 1');
        expect(ended.outcome).toBe('verified');
        if (ended.outcome !== 'verified') return;
        expect(ended.verifyRun.exitCode).toBe(1);
        expect(ended.reward).toBeUndefined();
        expect(ended.verifyRun.stdout.totalBytes).toBe(forged.length);
        expect(ended.verifyRun.stderr.totalBytes).toBe(forged.length);
        // The copy is the workspace's own tar, with the forged bytes as a file in it.
        expect(await names(ended.workspaceTar!)).toEqual(['workspace/', 'workspace/frames.bin']);
      } finally {
        await s.remove();
      }
    });

    it('survives a verifier that prints frame markers and 8 MiB of binary: capped, counted, graded by its exit code', async () => {
      const s = await own('binary');
      try {
        const ended = await endTurn(s, 'printf "SRwFT\\377\\377\\377\\377"; head -c 8388608 /dev/urandom; exit 0');
        expect(ended.outcome).toBe('verified');
        if (ended.outcome !== 'verified') return;
        expect(ended.verifyRun.exitCode).toBe(0);
        expect(ended.verifyRun.stdout.totalBytes).toBe(9 + 8 * 1024 * 1024);
        expect(ended.verifyRun.stdout.truncated).toBe(true);
      } finally {
        await s.remove();
      }
    });

    it('refuses a tests tar whose entries leave /tests or go through links: nothing written outside, the verifier never runs', async () => {
      const hostile: Array<[string, (pack: tar.Pack) => void]> = [
        ['a symlink out, then a file through it', (pack) => {
          pack.entry({ name: 'tests/out', type: 'symlink', linkname: '/workspace' });
          pack.entry({ name: 'tests/out/pwned.txt', mode: 0o644 }, 'pwned\n');
        }],
        ['a climbing name', (pack) => pack.entry({ name: 'tests/../workspace/pwned.txt', mode: 0o644 }, 'pwned\n')],
        ['an absolute name', (pack) => pack.entry({ name: '/workspace/pwned.txt', mode: 0o644 }, 'pwned\n')],
        ['a name outside tests/', (pack) => pack.entry({ name: 'workspace/pwned.txt', mode: 0o644 }, 'pwned\n')],
        ['a hard link to a file outside', (pack) => pack.entry({ name: 'tests/hl', type: 'link', linkname: 'workspace/victim.txt' })],
      ];
      const s = await own('hostile-tests');
      try {
        await s.putArchive(await tarBuffer((pack) => pack.entry({ name: 'workspace/victim.txt', mode: 0o644, uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid }, 'victim\n')), '/');
        for (const [what, add] of hostile) {
          const tests = await tarBuffer((pack) => {
            pack.entry({ name: 'tests/', type: 'directory', mode: 0o755 });
            add(pack);
          });
          const ended = await endTurn(s, 'echo VERIFIER-RAN', { tests });
          expect(ended.outcome, what).toBe('tests-failed');
          const after = await run(s, 'ls -A /workspace; cat /workspace/victim.txt');
          expect(after.stdout.text, what).toBe('victim.txt\nvictim\n');
        }
      } finally {
        await s.remove();
      }
    });

    it('empties what the agent left in /tests (a fake test, a folder it locked, a link) before the real tests go in', async () => {
      const s = await own('prefilled-tests');
      try {
        const planted = await run(s, [
          'echo "exit 0" > /tests/check.txt',
          'mkdir -p /tests/locked/deep && echo x > /tests/locked/deep/f && chmod 000 /tests/locked/deep /tests/locked',
          'ln -s /workspace /tests/link',
          'ls -A /tests | tr "\\n" " "',
        ].join(' && '));
        expect(planted.stdout.text.trim()).toBe('check.txt link locked');
        const ended = await endTurn(s, 'ls -A /tests; cat /tests/check.txt');
        expect(ended.outcome).toBe('verified');
        if (ended.outcome !== 'verified') return;
        expect(ended.verifyRun.stdout.text).toBe('check.txt\ntests in\n');
      } finally {
        await s.remove();
      }
    });
  });

  it('ends a restarted (Harbor) sandbox\'s turn as root: /tests replaced whole, the parts overlaid in order, test.sh made executable, the verifier\'s env, its reward file', async () => {
    const s = await SandboxSession.open(deps, { ...endSpec, owner: { ...owner, episodeId: `${owner.episodeId}-restarted` } }, () => undefined);
    try {
      // /tests made root's, as a Harbor image has it (this sandbox's root has no capabilities: it can only remove what it owns).
      const planted = await s.exec('rmdir /tests && mkdir -p /tests/sub && echo planted > /tests/conftest.py && echo 1 > /tests/sub/old && mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt',
        { timeoutMs: 10_000, capBytes: 4096, user: '0', workdir: '/' });
      expect(planted.exitCode).toBe(0);
      const part = (files: Record<string, string>) => tarBuffer((pack) => {
        pack.entry({ name: 'tests/', type: 'directory', mode: 0o755 });
        for (const [name, body] of Object.entries(files)) pack.entry({ name: `tests/${name}`, mode: 0o644 }, body);
      });
      const ended = await s.endTurn({
        runtimeMountPath: runtime.mountPath, workdir: '/workspace', testsDir: '/tests', copyCapBytes: null,
        tests: [await part({ 'test.sh': 'echo one\n', 'keep.txt': 'kept\n' }), await part({ 'test.sh': '#!/bin/sh\necho "two $FOO $(id -u)"; ls -A /tests; echo 0.25 > /logs/verifier/reward.txt\n' })],
        command: '/tests/test.sh', rewardFile: true, verifierTimeoutMs: 10_000, outputCapBytes: 64 * 1024,
        asRoot: { logsMode: 0o777, env: { FOO: 'bar' }, shell: ['/bin/sh', '-c'], executable: ['test.sh'] },
        signal: new AbortController().signal,
      });
      expect(ended.outcome).toBe('verified');
      if (ended.outcome !== 'verified') return;
      expect(ended.verifyRun.exitCode).toBe(0);
      expect(ended.verifyRun.stdout.text).toBe('two bar 0\nkeep.txt\ntest.sh\n');
      expect(ended.reward?.txt?.toString()).toBe('0.25\n');
      expect(ended.workspaceTar).toBeUndefined();
      const owners = await s.exec('stat -c "%u %a %n" /tests /tests/test.sh /tests/keep.txt', { timeoutMs: 10_000, capBytes: 4096 });
      expect(owners.stdout.text).toBe('0 755 /tests\n0 755 /tests/test.sh\n0 644 /tests/keep.txt\n');
    } finally {
      await s.remove();
    }
  });

  it("unpacks the workspace in the command agent's own exec, modes kept, and puts it through the engine when the image has no tar", async () => {
    // The busybox image, and a dash one without tar and head (busybox's ash would run its own applets).
    const dash = `rollout-fleet/sandbox-test:dash-unpack-${process.pid}`;
    await buildDashImage(docker, dash);
    const bare = `rollout-fleet/sandbox-test:no-tar-${process.pid}`;
    const maker = await docker.createContainer({ Image: dash, Cmd: ['/bin/rm', '-f', '/bin/tar', '/bin/head'], User: '0:0' });
    await maker.start();
    await maker.wait();
    await maker.commit({ repo: bare.split(':')[0], tag: bare.split(':')[1] });
    await maker.remove();
    const workspace = await tarBuffer((pack) => {
      pack.entry({ name: 'workspace/', type: 'directory', mode: 0o755, uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid });
      pack.entry({ name: 'workspace/run.sh', mode: 0o750, uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid }, 'echo ran >> /tmp/runs\n');
      pack.entry({ name: 'workspace/sub/', type: 'directory', mode: 0o700, uid: SANDBOX_USER.uid, gid: SANDBOX_USER.gid });
    });
    try {
      for (const image of [DEFAULT_IMAGE, bare]) {
        const s = await SandboxSession.open(deps, { ...endSpec, image, owner: { ...owner, episodeId: `${owner.episodeId}-unpack` } }, () => undefined);
        try {
          let puts = 0;
          const put = s.putArchive.bind(s);
          s.putArchive = (...args) => {
            puts += 1;
            return put(...args);
          };
          const ran = await new CommandAgent('sh run.sh; stat -c "%a %u %n" run.sh sub; cat /tmp/runs | wc -l; cat - | wc -c').run({
            session: s, task: { id: 'unpack', instruction: 'x' } as TaskSpec, archive: undefined as never, ceilingMs: 10_000, outputCapBytes: 64 * 1024,
            signal: new AbortController().signal, workspaceIn: workspace,
          });
          // The agent ran once, on the workspace as the tar said, with nothing left on its stdin.
          expect(ran.exitCode, `${image}: ${ran.stderr.text}`).toBe(0);
          expect(ran.stdout.text.trim().split('\n'), image).toEqual(['750 1000 run.sh', '700 1000 sub', '1', '0']);
          // The engine was asked to put it only where the image has no tar.
          expect(puts, image).toBe(image === bare ? 1 : 0);
        } finally {
          await s.remove();
        }
      }
    } finally {
      for (const image of [bare, dash]) await docker.getImage(image).remove({ force: true }).catch(() => undefined);
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
