// What an episode's environment costs (every container at its limits: main, each sidecar, the
// namespace holder), and the worker's budget of it: episodes start only when their environment fits
// beside the running ones, in pick-up order, and one larger than the whole budget runs alone.
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { loadTask } from '../../src/tasks/load-task.ts';
import { HOLDER_LIMITS } from '../../src/sandbox/task-services.ts';
import { ResourceBudget, environmentCost, type EnvironmentCost } from '../../src/episode/resource-budget.ts';

const FIXTURES = fileURLToPath(new URL('../fixtures/', import.meta.url));
const one = (memoryMb: number, cpus = 1): EnvironmentCost => ({ memoryMb, cpus, containers: 1 });

describe('environmentCost', () => {
  it('counts a task with services by every container of its environment, not as one container', async () => {
    const plain = (await loadTask(path.join(FIXTURES, 'harbor/hello-file'))).spec;
    expect(environmentCost(plain)).toEqual({ memoryMb: plain.limits.memoryMb, cpus: plain.limits.cpus, containers: 1 });
    // main + api sidecar, 512 MiB and 1 CPU each, and the holder.
    const api = (await loadTask(path.join(FIXTURES, 'harbor-services/api-sidecar'))).spec;
    expect(environmentCost(api)).toEqual({ memoryMb: 2 * 512 + HOLDER_LIMITS.memoryMb, cpus: 2 + HOLDER_LIMITS.cpus, containers: 3 });
    // main + seed + api at 256 MiB and 0.5 CPU each.
    const three = (await loadTask(path.join(FIXTURES, 'harbor-services-kill/three-services'))).spec;
    expect(environmentCost(three)).toEqual({ memoryMb: 3 * 256 + HOLDER_LIMITS.memoryMb, cpus: 1.5 + HOLDER_LIMITS.cpus, containers: 4 });
  });

  it('counts a separate verifier larger than main at its own limits (it runs once main stopped)', () => {
    const task = { limits: { memoryMb: 512, cpus: 1, pids: 256 }, harbor: { separateVerifier: { limits: { memoryMb: 2048 } } } };
    expect(environmentCost(task as never)).toEqual({ memoryMb: 2048, cpus: 1, containers: 1 });
  });
});

describe('ResourceBudget', () => {
  it('admits what fits, holds the rest in pick-up order, and lets the next in when one ends', async () => {
    const budget = new ResourceBudget({ memoryMb: 2000 });
    const a = await budget.acquire(one(1200));
    const order: string[] = [];
    const b = budget.acquire(one(1000)).then((r) => (order.push('b'), r));
    // Small enough to fit beside a, but behind b: it waits its turn.
    const c = budget.acquire(one(500)).then((r) => (order.push('c'), r));
    await Promise.resolve();
    expect(budget.snapshot()).toMatchObject({ used: { memoryMb: 1200, episodes: 1 }, waiting: 2 });
    a();
    a(); // a second release changes nothing
    const [rb, rc] = await Promise.all([b, c]);
    expect(order).toEqual(['b', 'c']);
    expect(budget.snapshot()).toMatchObject({ used: { memoryMb: 1500, episodes: 2 }, waiting: 0 });
    rb();
    rc();
    expect(budget.snapshot().used).toEqual({ memoryMb: 0, cpus: 0, containers: 0, episodes: 0 });
  });

  it('counts CPUs when a CPU budget is set', async () => {
    const budget = new ResourceBudget({ cpus: 2 });
    const a = await budget.acquire(one(100, 1.5));
    let admitted = false;
    const b = budget.acquire(one(100, 1)).then((r) => ((admitted = true), r));
    await Promise.resolve();
    expect(admitted).toBe(false);
    a();
    (await b)();
    expect(admitted).toBe(true);
  });

  it('runs an environment larger than the whole budget alone rather than never', async () => {
    const budget = new ResourceBudget({ memoryMb: 1000 });
    const small = await budget.acquire(one(100));
    let admitted = false;
    const big = budget.acquire(one(5000)).then((r) => ((admitted = true), r));
    await Promise.resolve();
    expect(admitted).toBe(false);
    small();
    const release = await big;
    expect(budget.snapshot().used.memoryMb).toBe(5000);
    release();
  });

  it('a wait given up (its episode stopped) leaves the queue and lets the ones behind it in', async () => {
    const budget = new ResourceBudget({ memoryMb: 1000 });
    const a = await budget.acquire(one(600));
    const stop = new AbortController();
    const big = budget.acquire(one(900), stop.signal);
    let admitted = false;
    const small = budget.acquire(one(300)).then((r) => ((admitted = true), r));
    await Promise.resolve();
    expect(admitted).toBe(false);
    stop.abort(new Error('cancelled'));
    await expect(big).rejects.toThrow('cancelled');
    (await small)();
    expect(admitted).toBe(true);
    a();
    expect(budget.snapshot()).toMatchObject({ used: { episodes: 0 }, waiting: 0 });
  });

  it('refuses a budget that is not a positive number, naming it', () => {
    expect(() => new ResourceBudget({ memoryMb: 0 })).toThrow(/memoryMb: expected a positive number, got 0/);
  });
});
