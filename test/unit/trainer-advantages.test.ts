// The Python example trainer's arithmetic on float rewards (examples/trainer/trainer.py, run by
// python3): GRPO's group-relative advantages, ungraded samples left out, an all-equal group giving
// zeros, and the per-metric means of a group.
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { describe, expect, it } from 'vitest';

const TRAINER_DIR = path.join(import.meta.dirname, '../../examples/trainer');

function py(expression: string): unknown {
  const out = execFileSync('python3', ['-c', `import json, sys; sys.path.insert(0, ${JSON.stringify(TRAINER_DIR)}); import trainer; print(json.dumps(${expression}))`], { encoding: 'utf8' });
  return JSON.parse(out);
}

describe('the Python trainer on float rewards', () => {
  it('gives each sample (reward - mean) / std over the graded ones', () => {
    const got = py('trainer.advantages([0.25, 0.75, None, 0.5])') as (number | null)[];
    // mean 0.5, population std sqrt(((0.25)^2 + (0.25)^2 + 0) / 3) = 0.2041
    const std = Math.sqrt((0.0625 + 0.0625) / 3);
    expect(got[0]).toBeCloseTo(-0.25 / std, 9);
    expect(got[1]).toBeCloseTo(0.25 / std, 9);
    expect(got[2]).toBeNull();
    expect(got[3]).toBeCloseTo(0, 9);
    expect(py('trainer.advantages([0.5, 0.5, 0.5])')).toEqual([0, 0, 0]);
    expect(py('trainer.advantages([None, None])')).toEqual([null, null]);
  });

  it('means each metric over the samples that reported it', () => {
    expect(py('trainer.metric_means([{"correctness": 1, "style": 0}, None, {"correctness": 0.5}])')).toEqual({ correctness: 0.75, style: 0 });
    expect(py('trainer.metric_means([None, None])')).toEqual({});
  });
});
