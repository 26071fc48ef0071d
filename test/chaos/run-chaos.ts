// `npm run chaos`: the long chaos run (defaults: 120 episodes of up to 8 s, 3 workers, 60 faults of every kind, a
// private second engine so dockerd can be restarted), printed as the table docs/RELIABILITY.md keeps.
// Options: --episodes N --workers N --concurrency N --faults N --kinds a,b --seed N --agent-max-sec N
// --shared-engine (no dockerd restarts: the engine other work uses is never touched) --llm (the
// reference agent against the scripted model, which the model-down and model-hang faults strike)
import { parseArgs } from 'node:util';
import { FAULT_KINDS, runChaos, type FaultKind } from './chaos-run.ts';

const { values } = parseArgs({
  options: {
    episodes: { type: 'string', default: '120' },
    'agent-max-sec': { type: 'string', default: '8' },
    workers: { type: 'string', default: '3' },
    concurrency: { type: 'string', default: '3' },
    faults: { type: 'string', default: '60' },
    kinds: { type: 'string', default: FAULT_KINDS.join(',') },
    seed: { type: 'string', default: String(Date.now() % 1_000_000) },
    'shared-engine': { type: 'boolean', default: false },
    llm: { type: 'boolean', default: false },
  },
});

const int = (name: string, v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new TypeError(`--${name}: expected an integer from 0 up, got ${JSON.stringify(v)}`);
  return n;
};
const kinds = values.kinds.split(',').map((k) => {
  if (!(FAULT_KINDS as readonly string[]).includes(k)) throw new TypeError(`--kinds: unknown fault ${JSON.stringify(k)} (known: ${FAULT_KINDS.join(', ')})`);
  return k as FaultKind;
});
const secondEngine = !values['shared-engine'];
const agent = values.llm ? 'llm' : 'command';
const seed = int('seed', values.seed);
const figures = await runChaos({
  episodes: int('episodes', values.episodes),
  workers: int('workers', values.workers),
  concurrency: int('concurrency', values.concurrency),
  faults: int('faults', values.faults),
  kinds: kinds.filter((k) => (secondEngine || k !== 'restart-dockerd') && (agent === 'llm' || !k.startsWith('model-'))),
  agent,
  gapMs: [500, 3_000],
  secondEngine,
  seed,
  timeoutMs: 15 * 60_000,
  agentMaxSec: Math.max(1, int('agent-max-sec', values['agent-max-sec'])),
  log: (line) => process.stderr.write(`[chaos] ${line}\n`),
});

const faults = Object.entries(figures.faults).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${n}`).join(', ');
process.stdout.write([
  `chaos run (seed ${seed}, ${agent} agent, ${values.workers} workers x ${values.concurrency}, ${secondEngine ? 'second engine' : 'shared engine'}): ${Math.round(figures.wallMs / 1000)} s`,
  '',
  '| episodes | faults | recorded | lost | second results refused | misgraded | infra errors | model errors | sandboxes left |',
  '|---|---|---|---|---|---|---|---|---|',
  `| ${figures.episodes} | ${faults} | ${figures.recorded} | ${figures.lost} | ${figures.doubled} | ${figures.misgraded} | ${figures.infraErrors} | ${figures.modelErrors} | ${figures.sandboxesLeft} |`,
  '',
].join('\n'));
process.exitCode = figures.lost + figures.doubled + figures.misgraded + figures.sandboxesLeft === 0 ? 0 : 1;
