// What an episode's environment costs, and the worker's budget of it. An episode is one container
// unless its task has services (environment/docker-compose.yaml): then it is the agent's container, one
// container per sidecar, each with the task's memory and CPU limits (src/sandbox/task-services.ts), and
// the namespace holder's small share. Admission counts the episodes a worker runs at once (its
// allowance, src/worker/admission.ts); this counts what they cost: an episode starts only when its
// environment's memory (and CPUs, when a CPU budget is set) fits beside those of the episodes already
// running, so a worker of 8 slots runs 8 one-container episodes but only as many four-container
// environments as its memory holds. Episodes wait their turn in the order they were picked up (a large
// environment is not passed over for ever by smaller ones). An environment larger than the whole
// budget runs alone (it waits until nothing else runs) rather than never.
import { HOLDER_LIMITS } from '../sandbox/task-services.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';

export interface EnvironmentCost {
  /** The sum of its containers' memory limits, in MiB. */
  memoryMb: number;
  /** The sum of its containers' CPU limits. */
  cpus: number;
  /** Containers that run at once. */
  containers: number;
}

/** What an episode of `task` costs while it runs: every container of its environment at its limits. */
export function environmentCost(task: Pick<TaskSpec, 'limits' | 'harbor'>): EnvironmentCost {
  const { memoryMb, cpus } = task.limits;
  // A separate verifier runs after main stopped: the larger of the two is what runs at once.
  const verifier = task.harbor?.separateVerifier?.limits;
  const mainMemory = Math.max(memoryMb, verifier?.memoryMb ?? 0);
  const mainCpus = Math.max(cpus, verifier?.cpus ?? 0);
  const sidecars = task.harbor?.services?.sidecars.length ?? 0;
  if (sidecars === 0) return { memoryMb: mainMemory, cpus: mainCpus, containers: 1 };
  return {
    memoryMb: mainMemory + sidecars * memoryMb + HOLDER_LIMITS.memoryMb,
    cpus: round(mainCpus + sidecars * cpus + HOLDER_LIMITS.cpus),
    containers: 2 + sidecars,
  };
}

const round = (x: number) => Math.round(x * 1000) / 1000;

export interface BudgetLimits {
  /** Memory of the environments running at once, in MiB. @default unlimited */
  memoryMb?: number | undefined;
  /** CPUs (their limits summed) of the environments running at once. @default unlimited */
  cpus?: number | undefined;
}

export interface BudgetSnapshot {
  limits: BudgetLimits;
  /** What the running environments hold. */
  used: { memoryMb: number; cpus: number; containers: number; episodes: number };
  /** Episodes waiting for room. */
  waiting: number;
}

interface Waiter {
  cost: EnvironmentCost;
  grant: (release: () => void) => void;
}

/** The worker's budget: acquire() resolves with a release once the cost fits, in pick-up order. */
export class ResourceBudget {
  #used = { memoryMb: 0, cpus: 0, containers: 0, episodes: 0 };
  readonly #queue: Waiter[] = [];

  constructor(readonly limits: BudgetLimits = {}) {
    for (const [name, v] of Object.entries(limits)) {
      if (v !== undefined && !(typeof v === 'number' && v > 0)) throw new RangeError(`${name}: expected a positive number, got ${String(v)}`);
    }
  }

  /** Whether `cost` fits now beside what runs (anything fits when nothing runs). */
  #fits(cost: EnvironmentCost): boolean {
    if (this.#used.episodes === 0) return true;
    const { memoryMb, cpus } = this.limits;
    if (memoryMb !== undefined && this.#used.memoryMb + cost.memoryMb > memoryMb) return false;
    if (cpus !== undefined && this.#used.cpus + cost.cpus > cpus + 1e-9) return false;
    return true;
  }

  #take(cost: EnvironmentCost): () => void {
    const u = this.#used;
    u.memoryMb += cost.memoryMb;
    u.cpus = round(u.cpus + cost.cpus);
    u.containers += cost.containers;
    u.episodes += 1;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      u.memoryMb -= cost.memoryMb;
      u.cpus = round(u.cpus - cost.cpus);
      u.containers -= cost.containers;
      u.episodes -= 1;
      this.#grantWaiting();
    };
  }

  #grantWaiting(): void {
    // In order: the first waiter that does not fit holds back the ones behind it.
    while (this.#queue.length > 0 && this.#fits(this.#queue[0]!.cost)) {
      const next = this.#queue.shift()!;
      next.grant(this.#take(next.cost));
    }
  }

  /** Resolves with a release (idempotent) once `cost` fits; rejects with the signal's reason if it aborts first. */
  acquire(cost: EnvironmentCost, signal?: AbortSignal): Promise<() => void> {
    signal?.throwIfAborted();
    if (this.#queue.length === 0 && this.#fits(cost)) return Promise.resolve(this.#take(cost));
    return new Promise((resolve, reject) => {
      const waiter: Waiter = {
        cost,
        grant: (release) => {
          signal?.removeEventListener('abort', onAbort);
          resolve(release);
        },
      };
      const onAbort = () => {
        const i = this.#queue.indexOf(waiter);
        if (i >= 0) this.#queue.splice(i, 1);
        // Its leaving may let the ones behind it in.
        this.#grantWaiting();
        reject(signal!.reason as Error);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.#queue.push(waiter);
    });
  }

  snapshot(): BudgetSnapshot {
    return { limits: { ...this.limits }, used: { ...this.#used }, waiting: this.#queue.length };
  }
}
