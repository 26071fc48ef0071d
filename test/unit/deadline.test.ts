// The phase deadline: its signal's reason says which phase and which step ran out of time; a parent's
// abort comes through with the parent's reason; work that settles too late is handed to onLate.
import { once } from 'node:events';
import { describe, expect, it } from 'vitest';
import { Deadline, PhaseTimeout, untilAborted } from '../../src/deadlines/deadline.ts';
import { EpisodeStop } from '../../src/errors/episode-stop.ts';

const never = () => new Promise<never>(() => undefined);

describe('Deadline', () => {
  it('ends a step that never settles with a PhaseTimeout naming the phase and the step, retried as infra', async () => {
    const deadline = new Deadline('set-up', 50);
    const started = performance.now();
    const err = await deadline.run('fetching the task archive', never).catch((e: unknown) => e);
    expect(performance.now() - started).toBeLessThan(1_000);
    expect(err).toBeInstanceOf(PhaseTimeout);
    expect(err).toMatchObject({ phase: 'set-up', code: 'phase_timeout', outcome: { kind: 'infra', retry: true } });
    expect((err as Error).message).toContain('fetching the task archive');
    deadline.dispose();
  });

  it('aborts with the parent reason (a cancel) before its own time is up', async () => {
    const parent = new AbortController();
    const deadline = new Deadline('agent', 60_000, parent.signal);
    const pending = deadline.run('x', never).catch((e: unknown) => e);
    parent.abort(new EpisodeStop('cancelled'));
    expect(await pending).toBeInstanceOf(EpisodeStop);
    deadline.dispose();
  });

  it('lets stoppable work finish stopping on a cancel, and cuts it only at the time limit', async () => {
    const parent = new AbortController();
    const deadline = new Deadline('verify', 60_000, parent.signal);
    const stoppable = deadline.runStoppable('running the verifier', (signal) =>
      new Promise<string>((resolve) => signal.addEventListener('abort', () => setImmediate(() => resolve('stopped with output')), { once: true })));
    parent.abort(new EpisodeStop('cancelled'));
    await expect(stoppable).resolves.toBe('stopped with output');
    deadline.dispose();

    const short = new Deadline('verify', 30);
    await expect(short.runStoppable('running the verifier', never)).rejects.toBeInstanceOf(PhaseTimeout);
    short.dispose();
  });

  it('gives a step its own slice, never past the phase', async () => {
    const deadline = new Deadline('close', 60_000);
    const slice = deadline.within(30, 'marking the episode closing');
    await expect(untilAborted(never(), slice)).rejects.toMatchObject({ phase: 'close', message: expect.stringContaining('marking the episode closing') });
    expect(deadline.signal.aborted).toBe(false);
    deadline.dispose();

    const ending = new Deadline('close', 20);
    const long = ending.within(60_000, 'keeping evidence');
    await expect(untilAborted(never(), long)).rejects.toBeInstanceOf(PhaseTimeout);
    ending.dispose();
  });

  it('hands what a step opened too late to onLate, so it can be closed', async () => {
    const deadline = new Deadline('set-up', 20);
    let release!: (v: string) => void;
    const late = new Promise<string>((resolve) => (release = resolve));
    let closed!: (v: string) => void;
    const closedLate = new Promise<string>((resolve) => (closed = resolve));
    await expect(deadline.run('starting the model proxy', () => late, (v) => closed(v))).rejects.toBeInstanceOf(PhaseTimeout);
    release('proxy');
    expect(await closedLate).toBe('proxy');
    deadline.dispose();
  });

  it('refuses to start a step once the phase is over', async () => {
    const deadline = new Deadline('set-up', 0);
    if (!deadline.signal.aborted) await once(deadline.signal, 'abort');
    let ran = false;
    await expect(deadline.run('late step', async () => {
      ran = true;
    })).rejects.toBeInstanceOf(PhaseTimeout);
    expect(ran).toBe(false);
    deadline.dispose();
  });
});

// The one race of work against a signal, which the phase deadlines and the fleet limits' turns share.
describe('untilAborted', () => {
  const deferred = <T>() => {
    let resolve!: (v: T) => void;
    let reject!: (e: unknown) => void;
    const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
    return { promise, resolve, reject };
  };

  it('rejects with the signal\'s reason and hands a value that comes after the abort to onLate once, never to the caller', async () => {
    const ctrl = new AbortController();
    const work = deferred<string>();
    const handed: string[] = [];
    const raced = untilAborted(work.promise, ctrl.signal, (v) => handed.push(v));
    const reason = new Error('caller gone');
    ctrl.abort(reason);
    await expect(raced).rejects.toBe(reason);
    work.resolve('a reserved slot');
    await work.promise;
    await new Promise((r) => setImmediate(r));
    expect(handed).toEqual(['a reserved slot']);
  });

  it('rejects at once on a signal already aborted while the work is pending, and the late value still goes to onLate', async () => {
    const ctrl = new AbortController();
    ctrl.abort(new Error('before'));
    const work = deferred<number>();
    let late: number | undefined;
    await expect(untilAborted(work.promise, ctrl.signal, (v) => (late = v))).rejects.toThrow('before');
    work.resolve(7);
    await new Promise((r) => setImmediate(r));
    expect(late).toBe(7);
  });

  it('gives work that already settled to the caller even when the signal has aborted too, and nothing to onLate', async () => {
    const ctrl = new AbortController();
    ctrl.abort(new Error('after the copy'));
    let late = false;
    await expect(untilAborted(Promise.resolve('copy'), ctrl.signal, () => (late = true))).resolves.toBe('copy');
    await new Promise((r) => setImmediate(r));
    expect(late).toBe(false);
  });

  it('passes the work\'s own error on when it fails first, and drops one that comes after the abort', async () => {
    await expect(untilAborted(Promise.reject(new Error('redis down')), new AbortController().signal)).rejects.toThrow('redis down');
    const ctrl = new AbortController();
    const work = deferred<string>();
    let late = false;
    const raced = untilAborted(work.promise, ctrl.signal, () => (late = true));
    ctrl.abort(new Error('deadline'));
    await expect(raced).rejects.toThrow('deadline');
    work.reject(new Error('too late to matter'));
    await new Promise((r) => setImmediate(r));
    expect(late).toBe(false);
  });
});
