// Harbor's reward files read as Harbor reads them: reward.json before reward.txt, floats kept, and a
// grader that could not grade (no file, empty, not a number) an error of the verifier, never a 0.
import { describe, expect, it } from 'vitest';
import { FleetError } from '../../src/errors/fleet-error.ts';
import { mainReward, readReward } from '../../src/episode/reward-file.ts';

const b = (s: string) => Buffer.from(s);

function codeOf(files: Parameters<typeof readReward>[0]): string {
  try {
    readReward(files);
  } catch (err) {
    expect(err).toBeInstanceOf(FleetError);
    expect((err as FleetError).outcome).toEqual({ kind: 'verifier', retry: false });
    return (err as FleetError).code;
  }
  return 'no error';
}

describe('reward files', () => {
  it('reads one float from reward.txt, partial credit kept', () => {
    expect(readReward({ txt: b('0.5\n') })).toEqual({ reward: 0.5, metrics: { reward: 0.5 } });
    expect(readReward({ txt: b(' 1 ') }).reward).toBe(1);
    expect(readReward({ txt: b('-2.5e-1') }).reward).toBe(-0.25);
  });

  it('prefers reward.json, keeps every key as a metric, and takes its reward key as the main reward', () => {
    expect(readReward({ json: b('{"reward": 0.25, "speed": 3}'), txt: b('1') })).toEqual({ reward: 0.25, metrics: { reward: 0.25, speed: 3 } });
  });

  it('without a reward key, the main reward is the only value, else the mean', () => {
    expect(readReward({ json: b('{"correctness": 1, "documentation": 0}') })).toEqual({ reward: 0.5, metrics: { correctness: 1, documentation: 0 } });
    expect(mainReward({ score: 0.75 })).toBe(0.75);
  });

  it('a grader that could not grade is an error with its code, not a reward of 0', () => {
    expect(codeOf({})).toBe('reward_file_missing');
    expect(codeOf({ txt: b('  \n') })).toBe('reward_file_empty');
    expect(codeOf({ json: b('') })).toBe('reward_file_empty');
    expect(codeOf({ txt: b('pass') })).toBe('reward_file_invalid');
    expect(codeOf({ txt: b('1 1') })).toBe('reward_file_invalid');
    expect(codeOf({ txt: b('Infinity') })).toBe('reward_file_invalid');
    expect(codeOf({ txt: b('1e999') })).toBe('reward_file_invalid');
    expect(codeOf({ json: b('{"a": "1"}') })).toBe('reward_file_invalid');
    expect(codeOf({ json: b('[1]') })).toBe('reward_file_invalid');
    expect(codeOf({ json: b('{}') })).toBe('reward_file_invalid');
    expect(codeOf({ json: b('{"a": 1') })).toBe('reward_file_invalid');
    expect(codeOf({ txt: b('1'.repeat(100_000)) })).toBe('reward_file_invalid');
  });

  it('never echoes a long file back', () => {
    try {
      readReward({ txt: b(`secret-looking-${'y'.repeat(500)}`) });
    } catch (err) {
      expect((err as Error).message).not.toContain('yyyy');
      return;
    }
    throw new Error('accepted');
  });
});
