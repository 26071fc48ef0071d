// The scripted policy as a pure function of (task, turn, wrong), and how a turn is read.
import { describe, expect, it } from 'vitest';
import { isWrongEpisode, scriptedTurn, taskByInstruction, turnOf } from '../../src/model/stub-script.ts';
import type { StubTask } from '../../src/model/stub-tasks.ts';

const task: StubTask = {
  id: 'quote',
  instruction: "Fix it's quoting.",
  workdir: "/work/it's",
  solution: [{ rel: 'lib/fix.txt', content: 'a\n' }, { rel: 'solve.sh', content: 'cp "$SOLUTION_DIR/lib/fix.txt" .\n' }],
};

describe('scripted policy', () => {
  it('writes each file, runs solve.sh with SOLUTION_DIR in the quoted workdir, finishes, then stops', () => {
    const steps = [0, 1, 2, 3, 4].map((t) => scriptedTurn(task, t, false));
    expect(steps).toEqual([
      { name: 'write_file', arguments: { path: '.solution/lib/fix.txt', content: 'a\n' } },
      { name: 'write_file', arguments: { path: '.solution/solve.sh', content: 'cp "$SOLUTION_DIR/lib/fix.txt" .\n' } },
      { name: 'bash', arguments: { command: "cd '/work/it'\\''s' && SOLUTION_DIR=.solution sh .solution/solve.sh", timeoutSec: 60 } },
      { name: 'finish', arguments: { answer: expect.any(String) } },
      undefined,
    ]);
  });

  it('looks around and finishes without solving when wrong, or when the task has no solution', () => {
    for (const t of [scriptedTurn(task, 0, true), scriptedTurn({ ...task, solution: undefined }, 0, false)]) {
      expect(t).toEqual({ name: 'bash', arguments: { command: "cd '/work/it'\\''s' && ls -la", timeoutSec: 60 } });
    }
    expect(scriptedTurn(task, 1, true)?.name).toBe('finish');
    expect(scriptedTurn(task, 2, true)).toBeUndefined();
  });

  it('reads the turn from the assistant messages of the conversation', () => {
    expect(turnOf([{ role: 'system' }, { role: 'user' }])).toBe(0);
    expect(turnOf([{ role: 'user' }, { role: 'assistant' }, { role: 'tool' }, { role: 'assistant' }, { role: 'tool' }])).toBe(2);
  });

  it('picks the same episodes as wrong every time, none at 0 and all at 1', () => {
    const ids = Array.from({ length: 1000 }, (_, i) => `b.t.${i}`);
    const wrong = ids.filter((id) => isWrongEpisode(id, 0.3));
    expect(ids.filter((id) => isWrongEpisode(id, 0.3))).toEqual(wrong);
    expect(wrong.length).toBeGreaterThan(300 - 50);
    expect(wrong.length).toBeLessThan(300 + 50);
    expect(ids.some((id) => isWrongEpisode(id, 0))).toBe(false);
    expect(ids.every((id) => isWrongEpisode(id, 1))).toBe(true);
    expect(isWrongEpisode(undefined, 0.9)).toBe(false);
  });

  it('matches a task by the longest instruction found in user or system text, content parts included', () => {
    const short: StubTask = { ...task, id: 'short', instruction: 'Fix it' };
    const parts = [{ role: 'user', content: [{ type: 'text', text: "Please: Fix it's quoting." }] }];
    expect(taskByInstruction([short, task], parts)?.id).toBe('quote');
    expect(taskByInstruction([short, task], [{ role: 'user', content: 'Fix it now' }])?.id).toBe('short');
    expect(taskByInstruction([short, task], [{ role: 'assistant', content: 'Fix it' }])).toBeUndefined();
  });
});
