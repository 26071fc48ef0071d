// The short chaos run of the suite: a dozen episodes with known rewards on three worker processes
// while workers are killed (-9), drained (SIGTERM, one and all) and Redis is killed and restarted from
// its AOF at random moments. Nothing is lost, nothing is recorded twice, no reward is wrong, no sandbox
// is left. And the reference agent against the scripted model while the model goes down (refused) and
// hangs (answers nothing) at random: every episode still ends once, graded right or not graded. The long
// run (`npm run chaos`) adds dockerd restarts and many more faults.
import { describe, expect, it } from 'vitest';
import { runChaos, type ChaosOptions } from '../chaos/chaos-run.ts';

/** A short run on the shared engine (seed from CHAOS_SEED to replay one), judged: nothing lost, doubled, misgraded or left. */
async function shortRun(label: string, opts: Pick<ChaosOptions, 'episodes' | 'workers' | 'concurrency' | 'faults' | 'kinds' | 'agent'>) {
  const seed = Number(process.env.CHAOS_SEED ?? Date.now() % 1_000_000);
  // Printed before the run too, so a run that hangs or is killed can still be replayed.
  console.info(`[chaos ${label}] seed ${seed} (CHAOS_SEED=${seed} replays it)`);
  const figures = await runChaos({ ...opts, gapMs: [300, 1_500], secondEngine: false, seed, timeoutMs: 240_000 });
  console.info(`[chaos ${label} seed ${seed}] ${JSON.stringify(figures)}`);
  expect(figures.lost, `seed ${seed}`).toBe(0);
  expect(figures.doubled, `seed ${seed}`).toBe(0);
  expect(figures.misgraded, `seed ${seed}`).toBe(0);
  expect(figures.sandboxesLeft, `seed ${seed}`).toBe(0);
  expect(Object.values(figures.faults).reduce((a, b) => a + b, 0)).toBeGreaterThan(0);
}

describe('chaos (short)', () => {
  it('loses nothing, doubles nothing and scores no fault as a reward', async () => {
    await shortRun('command', { episodes: 12, workers: 3, concurrency: 2, faults: 6, kinds: ['kill-worker', 'kill-worker', 'term-worker', 'term-all', 'restart-redis'] });
  }, 420_000);

  it('with a model that goes down and hangs, ends every llm episode once and never misgrades', async () => {
    await shortRun('llm', { episodes: 8, workers: 2, concurrency: 3, faults: 5, kinds: ['model-down', 'model-hang', 'kill-worker'], agent: 'llm' });
  }, 420_000);
});
