// What running sandboxes under gVisor (FLEET_SANDBOX_RUNTIME=runsc) costs against the engine's default
// (runc), in one run: the same sandbox sequence of the fleet's own session code, alternating runtimes
// round by round (runc first in even rounds, runsc first in odd), so both meet the same host load.
// A sequence: open (create + start, the fleet's hardened options), a trivial exec (`true`), a fork-heavy
// exec (50 programs started one after the other), a file-heavy exec (write and read back 200 small
// files), remove. Printed: each step's p50 per runtime and the ratio runsc/runc of the p50s.
//
// Run: npx tsx bench/gvisor-cost.ts [--rounds 10] [--runtime runsc]
import os from 'node:os';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { createDocker } from '../src/sandbox/docker-client.ts';
import { SandboxSession } from '../src/sandbox/sandbox-session.ts';
import { resolveSandboxRuntime, type SandboxRuntime } from '../src/sandbox/sandbox-runtime.ts';

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '10' }, runtime: { type: 'string', default: 'runsc' } } });
const rounds = Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 1) throw new TypeError(`--rounds: expected an integer from 1 up, got ${values.rounds}`);

const docker = createDocker(process.env.DOCKER_HOST ?? 'unix:///var/run/docker.sock');
const log = pino({ level: 'silent' });
const deps = { docker, log, callTimeoutMs: 60_000 };
const owner = { fleet: 'bench-gvisor', episodeId: `bench-gvisor-${process.pid}`, batchId: `bench-gvisor-${process.pid}`, workerId: 'bench-gvisor', attempt: 1 };
const limits = { memoryMb: 256, cpus: 1, pids: 64 };
const STEPS = {
  trivial: 'true',
  forks: 'for i in $(seq 1 50); do /bin/true; done',
  files: 'mkdir -p /tmp/f && for i in $(seq 1 200); do echo "$i" > /tmp/f/$i; done && cat /tmp/f/* | wc -l',
} as const;
type Step = 'open' | keyof typeof STEPS | 'remove' | 'total';
const STEP_NAMES: Step[] = ['open', 'trivial', 'forks', 'files', 'remove', 'total'];

async function sequence(runtime: SandboxRuntime | undefined): Promise<Record<Step, number>> {
  const t: Partial<Record<Step, number>> = {};
  const t0 = performance.now();
  let mark = t0;
  const lap = (step: Step) => {
    const now = performance.now();
    t[step] = now - mark;
    mark = now;
  };
  const session = await SandboxSession.open(deps, { image: 'rollout-fleet/sandbox:busybox', workdir: '/tmp', limits, owner, runtime }, () => undefined);
  try {
    lap('open');
    for (const [step, command] of Object.entries(STEPS) as [keyof typeof STEPS, string][]) {
      const r = await session.exec(command, { timeoutMs: 60_000, capBytes: 4096 });
      if (r.exitCode !== 0) throw new Error(`${step} under ${runtime?.name ?? 'runc'}: exit ${r.exitCode}: ${r.stderr.text}`);
      lap(step);
    }
  } finally {
    await session.remove();
  }
  lap('remove');
  t.total = performance.now() - t0;
  return t as Record<Step, number>;
}

const p50 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.ceil(xs.length / 2) - 1]!;
const runsc = await resolveSandboxRuntime(docker, values.runtime, { timeoutMs: 30_000 });
const sides = { runc: undefined, [runsc.name]: runsc } as Record<string, SandboxRuntime | undefined>;
const times: Record<string, Record<Step, number>[]> = Object.fromEntries(Object.keys(sides).map((k) => [k, []]));
// One of each first, not counted: image and page caches warm for both.
for (const rt of Object.values(sides)) await sequence(rt);
for (let round = 0; round < rounds; round++) {
  const order = round % 2 === 0 ? Object.keys(sides) : Object.keys(sides).reverse();
  for (const name of order) times[name]!.push(await sequence(sides[name]));
}

const [base, other] = Object.keys(sides) as [string, string];
process.stdout.write(`gvisor-cost: ${rounds} rounds, ${os.cpus().length} cores, load ${os.loadavg()[0]!.toFixed(1)}, ${base} vs ${other} (gVisor ${runsc.gvisor ? 'yes' : 'no'})\n`);
process.stdout.write(`${'step'.padEnd(8)} ${`${base} p50 ms`.padStart(14)} ${`${other} p50 ms`.padStart(15)} ${'ratio'.padStart(7)}\n`);
for (const step of STEP_NAMES) {
  const a = p50(times[base]!.map((t) => t[step]));
  const b = p50(times[other]!.map((t) => t[step]));
  process.stdout.write(`${step.padEnd(8)} ${a.toFixed(0).padStart(14)} ${b.toFixed(0).padStart(15)} ${(b / a).toFixed(2).padStart(7)}\n`);
}
