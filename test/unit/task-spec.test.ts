// Task resolution against batch defaults, and the agent ceiling check.
import { describe, expect, it } from 'vitest';
import { TaskFile, TaskSpec, agentCeilingSec, resolveTask } from '../../src/tasks/task-spec.ts';
import { describeIssues } from '../../src/config/zod-issues.ts';

const file = TaskFile.parse({ id: 't', instruction: 'do it', verify: { command: 'true', timeoutSec: 20 } });

describe('task spec', () => {
  it('takes task.yaml over batch defaults over built-in defaults', () => {
    const spec = TaskSpec.parse(resolveTask({ ...file, limits: { pids: 99 } }, { deadlineSec: 900, limits: { memoryMb: 128, pids: 50 } }));
    expect(spec.limits).toEqual({ memoryMb: 128, cpus: 1, pids: 99, diskMb: 2048 });
    expect(spec.deadlineSec).toBe(900);
    expect(spec.reserves).toEqual({ setupSec: 60, verifySec: 30, closeSec: 30 });
    expect(agentCeilingSec(spec)).toBe(900 - 60 - 30 - 30);
  });

  it('rejects a deadline the reserves use up, naming the field and the numbers', () => {
    const input = resolveTask({ ...file, deadlineSec: 120 });
    const parsed = TaskSpec.safeParse(input);
    expect(parsed.success).toBe(false);
    const [problem] = describeIssues(parsed.error!, input);
    expect(problem).toBe('deadlineSec: leaves the agent no time: deadline minus reserves (setup 60 + verify 30 + close 30) must be positive (got 120)');
  });

  it('rejects a verify reserve shorter than the verifier timeout', () => {
    const input = resolveTask({ ...file, reserves: { verifySec: 5 } });
    const parsed = TaskSpec.safeParse(input);
    expect(describeIssues(parsed.error!, input)).toEqual(['reserves.verifySec: must be at least verify.timeoutSec (20) (got 5)']);
  });

  it('rejects unknown fields in task.yaml instead of ignoring them', () => {
    const input = { id: 't', instruction: 'x', verify: { command: 'true' }, timeout: 5 };
    const parsed = TaskFile.safeParse(input);
    expect(describeIssues(parsed.error!, input)[0]).toMatch(/^\(root\): Unrecognized key: "timeout"/);
  });

  it('takes verify.reward: file or exit-code, names the field for anything else, and keeps exit-code specs as they were', () => {
    const input = { id: 't', instruction: 'x', verify: { command: 'true', reward: 'json' } };
    const parsed = TaskFile.safeParse(input);
    expect(describeIssues(parsed.error!, input)).toEqual(['verify.reward: Invalid option: expected one of "exit-code"|"file" (got "json")']);
    const byFile = TaskSpec.parse(resolveTask(TaskFile.parse({ ...input, verify: { command: 'true', reward: 'file' } })));
    expect(byFile.verify).toEqual({ command: 'true', timeoutSec: 60, reward: 'file' });
    // Exit-code grading, said or not, resolves to the spec it had before the field (so the same digest and batch id).
    for (const reward of [undefined, 'exit-code'] as const) {
      const spec = TaskSpec.parse(resolveTask(TaskFile.parse({ ...input, verify: { command: 'true', ...(reward && { reward }) } })));
      expect(spec.verify).toEqual({ command: 'true', timeoutSec: 60 });
    }
  });
});
