// The environment lease ends exactly what was opened: a sandbox the cleanup queue takes in time is
// not removed directly; one it does not take is removed directly while the hand-over goes on; the run
// folder goes in both cases, and a lease that never saw a container only removes its folder. The
// engine here is a client of a socket that does not exist: any removal it is asked for fails, loudly.
import { access, mkdir, mkdtemp } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import Docker from 'dockerode';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { EnvironmentLease, type LeaseDeps } from '../../src/sandbox/environment-lease.ts';

const CONTAINER = 'a'.repeat(64);

function capture() {
  const lines: Array<{ msg: string; containerId?: string }> = [];
  const out = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString().trim().split('\n').map((l) => JSON.parse(l) as { msg: string }));
      done();
    },
  });
  return { lines, log: pino({ level: 'warn' }, out) };
}

async function until(what: string, check: () => Promise<boolean> | boolean): Promise<void> {
  const deadline = Date.now() + 5_000;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

const gone = (folder: string) => access(folder).then(() => false, () => true);

async function runFolder(): Promise<string> {
  const folder = path.join(await mkdtemp(path.join(os.tmpdir(), 'lease-')), 'run');
  await mkdir(folder);
  return folder;
}

function lease(scheduleCleanup: LeaseDeps['scheduleCleanup']) {
  const { lines, log } = capture();
  const docker = new Docker({ socketPath: path.join(os.tmpdir(), 'no-engine-here.sock') });
  return { lines, lease: new EnvironmentLease({ docker, log, callTimeoutMs: 1_000, scheduleCleanup }, 'ep-1') };
}

describe('EnvironmentLease', () => {
  it('hands a sandbox the queue takes in time to the queue only, then removes the run folder', async () => {
    const handed: Array<[string, string]> = [];
    const { lines, lease: l } = lease(async (episodeId, containerId) => {
      handed.push([episodeId, containerId]);
    });
    const folder = await runFolder();
    l.registerContainer(CONTAINER);
    l.useFolder(folder);
    await l.end(new AbortController().signal);
    expect(handed).toEqual([['ep-1', CONTAINER]]);
    await until('the run folder to go', () => gone(folder));
    expect(lines.map((l) => l.msg)).toEqual([]);
  });

  it('hands an environment with services over with its key: the holder registered first, then main', async () => {
    const handed: Array<[string, string, string | undefined]> = [];
    const { lease: l } = lease(async (episodeId, containerId, environment) => {
      handed.push([episodeId, containerId, environment]);
    });
    l.registerContainer('a'.repeat(64), 'rf-ep-1-a1-abc123');
    l.registerContainer(CONTAINER);
    await l.end(new AbortController().signal);
    // The queue's job names main and the key: a retry after main is gone still ends every part.
    expect(handed).toEqual([['ep-1', CONTAINER, 'rf-ep-1-a1-abc123']]);
  });

  it('removes directly a sandbox the queue does not take in time, and lets the hand-over go on', async () => {
    let handedLate: (() => void) | undefined;
    const { lines, lease: l } = lease(() => new Promise<void>((resolve) => {
      handedLate = resolve;
    }));
    const folder = await runFolder();
    l.registerContainer(CONTAINER);
    l.useFolder(folder);
    await l.end(AbortSignal.abort());
    expect(lines[0]).toMatchObject({ msg: 'cleanup queue did not take the sandbox in time; removing it directly', containerId: CONTAINER });
    // The direct removal was asked of the engine (here none answers: it fails, naming the container).
    await until('the direct removal to fail', () => lines.some((x) => x.msg === 'sandbox not removed; the reaper will find it by its labels'));
    expect(lines.find((x) => x.msg.startsWith('sandbox not removed'))?.containerId).toBe(CONTAINER);
    await until('the run folder to go', () => gone(folder));
    expect(handedLate).toBeDefined();
    handedLate?.();
  });

  it('keeps the first run folder it is given, and ends only that folder when no container was made', async () => {
    const handed: string[] = [];
    const { lease: l } = lease(async (_episodeId, containerId) => {
      handed.push(containerId);
    });
    const folder = await runFolder();
    l.useFolder(folder);
    l.useFolder('/somewhere/else');
    expect(l.runFolder).toBe(folder);
    expect(l.containerId).toBeUndefined();
    expect(l.pooled).toBe(false);
    await l.end(new AbortController().signal);
    expect(handed).toEqual([]);
    await until('the run folder to go', () => gone(folder));
  });
});
