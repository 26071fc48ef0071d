// The task and batch schemas' limits: image references by the distribution/reference grammar, workdirs
// outside what the fleet and the kernel own, text an agent can be handed, an llm window with room for
// a prompt, batch names from file names, and messages that neither echo a file nor carry control
// characters.
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { SOLUTION_DIR } from '../../src/agent/oracle-agent.ts';
import { AGENT_INPUT_PATH } from '../../src/agent/reference/agent-input.ts';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { TESTS_DIR } from '../../src/episode/verify-phase.ts';
import { printable, printableLines } from '../../src/errors/printable.ts';
import { RUNTIME_MOUNT_PATH } from '../../src/runtime/portable-node.ts';
import { AgentSpec, MAX_AGENT_COMMAND_BYTES } from '../../src/tasks/agent-spec.ts';
import { BatchFile } from '../../src/tasks/batch-spec.ts';
import { batchNameFromFile } from '../../src/tasks/load-task.ts';
import { MAX_COMMAND_BYTES, MAX_INSTRUCTION_BYTES, RESERVED_SANDBOX_PATHS, TaskFile, TaskSpec, isImageReference, resolveTask } from '../../src/tasks/task-spec.ts';

const task = (extra: Record<string, unknown>) => ({ id: 't', instruction: 'do it', verify: { command: 'true' }, ...extra });
const problems = (input: unknown) => {
  const parsed = TaskFile.safeParse(input);
  return parsed.success ? [] : describeIssues(parsed.error, input);
};

describe('image references', () => {
  it.each([
    'busybox', 'busybox:1.36', 'rollout-fleet/sandbox:busybox', 'library/busybox:latest', 'localhost:5000/a/b:c',
    '127.0.0.1:35007/x', 'registry.example.com/team/img_name__x:v1.2-rc', '[::1]:5000/x', 'Registry.Example.com/x',
    `busybox@sha256:${'a'.repeat(64)}`, `busybox:1@sha256:${'0'.repeat(64)}`, 'a--b/c.d',
  ])('accepts %s', (ref) => expect(isImageReference(ref)).toBe(true));

  it.each([
    '..//127.0.0.1:35007/x', '..//ssrf-probe.invalid/x', 'busybox; rm -rf /', 'Rollout-Fleet/Sandbox:BusyBox', 'busybox/json?all=1#',
    'busybox@sha256:xyz', `busybox@sha256:${'a'.repeat(40)}`, `busybox@sha256:${'A'.repeat(64)}`, `busybox@md5:${'a'.repeat(32)}`, 'busy\u001b[31mbox', 'busybox\nx', '', '/busybox', 'busybox/', 'a//b', '-a', 'a:', 'a:-tag', 'a:b:c',
    `a:${'t'.repeat(129)}`, 'a'.repeat(256), `${'a/'.repeat(300)}a`, 'http://host/x', 'a..b', 'A',
  ])('refuses %j', (ref) => expect(isImageReference(ref)).toBe(false));

  it('refuses a long near-miss quickly (no catastrophic backtracking)', () => {
    const started = performance.now();
    for (const ref of [`${'a-'.repeat(250)}!`, `${'a.'.repeat(250)}/!`, `${'a'.repeat(500)}:`]) expect(isImageReference(ref)).toBe(false);
    expect(performance.now() - started).toBeLessThan(100);
  });

  it('is checked in task.yaml, batch defaults and the resolved spec the worker parses', () => {
    expect(problems(task({ image: '..//127.0.0.1:1/x' }))[0]).toMatch(/^image: not a valid image reference.*\(got "\.\.\/\/127\.0\.0\.1:1\/x"\)$/);
    expect(BatchFile.safeParse({ tasks: ['t'], agent: { kind: 'oracle' }, defaults: { image: 'busybox; rm -rf /' } }).success).toBe(false);
    const spec = TaskSpec.parse(resolveTask(TaskFile.parse(task({}))));
    expect(TaskSpec.safeParse({ ...spec, image: 'Rollout-Fleet/Sandbox:BusyBox' }).success).toBe(false);
  });
});

describe('workdir', () => {
  it.each(['/', '//', '/.', '/proc', '/proc/self/cwd', '//proc', '/proc/.', '/sys/fs', '/dev', '/tests', '/tests/', '/solution/x', '/opt/rollout-fleet', '/opt/rollout-fleet/bin', '/tmp/rollout-agent'])(
    'refuses %s', (workdir) => expect(problems(task({ workdir }))[0]).toMatch(/^workdir: must not be/),
  );
  it.each(['/workspace', '/app', '/opt/app', '/testsuite', '/procedures', '/home/user/work'])('accepts %s', (workdir) => expect(problems(task({ workdir }))).toEqual([]));

  it('reserves every path the sandbox gives a meaning', () => {
    for (const used of [TESTS_DIR, SOLUTION_DIR, RUNTIME_MOUNT_PATH, path.posix.dirname(AGENT_INPUT_PATH)]) expect(RESERVED_SANDBOX_PATHS).toContain(used);
  });
});

describe('text an agent is handed', () => {
  it('caps the instruction at 64 KiB, in bytes, naming the limit and the size', () => {
    expect(problems(task({ instruction: 'x'.repeat(MAX_INSTRUCTION_BYTES) }))).toEqual([]);
    expect(problems(task({ instruction: 'é'.repeat(MAX_INSTRUCTION_BYTES / 2 + 1) }))).toEqual([
      `instruction: at most ${MAX_INSTRUCTION_BYTES} bytes (got ${MAX_INSTRUCTION_BYTES + 2} bytes) (got a string of ${MAX_INSTRUCTION_BYTES + 2} bytes)`,
    ]);
  });

  it('caps the verify and agent commands the same way, with one figure', () => {
    expect(MAX_AGENT_COMMAND_BYTES).toBe(MAX_COMMAND_BYTES);
    expect(problems(task({ verify: { command: 'x'.repeat(MAX_COMMAND_BYTES + 1) } }))[0]).toMatch(/^verify\.command: at most 65536 bytes/);
    expect(AgentSpec.safeParse({ kind: 'command', command: 'x'.repeat(MAX_AGENT_COMMAND_BYTES + 1) }).success).toBe(false);
  });
});

describe('llm agent settings', () => {
  it('refuses an output reserve that fills the context window', () => {
    const input = { kind: 'llm', contextWindowTokens: 1024, outputReserveTokens: 4096 };
    const parsed = AgentSpec.safeParse(input);
    expect(parsed.success).toBe(false);
    expect(describeIssues(parsed.error!, input)).toEqual(['outputReserveTokens: must be less than contextWindowTokens (1024), which must also hold the prompt (got 4096)']);
    expect(AgentSpec.safeParse({ kind: 'llm', contextWindowTokens: 2048, outputReserveTokens: 2048 }).success).toBe(false);
    expect(AgentSpec.parse({ kind: 'llm' })).toMatchObject({ contextWindowTokens: 32_768, outputReserveTokens: 2_048 });
  });
});

describe('batch names from file names', () => {
  it.each([['/x/demo.yaml', 'demo'], ['/x/_hidden.yaml', 'hidden'], ['/x/My Batch.YML', 'my-batch'], ['/x/.yaml', undefined], ['/x/---.yaml', undefined]])(
    '%s gives %s', (file, name) => expect(batchNameFromFile(file)).toBe(name),
  );
});

describe('messages', () => {
  it('never echo a document, a list or a long string, and name at most three unknown keys', () => {
    const lines = Object.fromEntries(Array.from({ length: 12 }, (_, i) => [`line-${i}`, `secret-${i}`]));
    const shown = problems(lines).join('\n');
    expect(shown).toContain('(root): Unrecognized keys: "line-0", "line-1", "line-2" and 9 more (got a mapping of 12 keys)');
    expect(shown).not.toMatch(/secret-/);
    expect(problems('root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1')).toEqual(['(root): Invalid input: expected object, received string (got a string of 44 bytes)']);
    expect(problems(task({ instruction: ['a', 'b'] }))[0]).toMatch(/\(got a list of 2 items\)$/);
  });

  it('escape control characters of paths and values', () => {
    expect(printable('a\nb\u001b[31mc\u009b2J\u202ed')).toBe('a\\nb\\x1b[31mc\\x9b2J\\u202ed');
    expect(printableLines('one\u001b\ntwo')).toBe('one\\x1b\ntwo');
    expect(problems(task({ image: 'x\u009by' }))[0]).toContain('(got "x\\x9by")');
  });
});
