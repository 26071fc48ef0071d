// Property-based tests (fast-check): arbitrary objects never crash the task and batch parsers (they
// parse, or every problem names a field without echoing a long value or a control character), and the
// agent event protocol never throws on arbitrary bytes while valid events survive any chunking.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { describeIssues } from '../../src/config/zod-issues.ts';
import { AgentEventParser, EVENT_MARKER, formatEvent, type AgentEvent } from '../../src/agent/reference/agent-events.ts';
import { AgentSpec } from '../../src/tasks/agent-spec.ts';
import { BatchFile } from '../../src/tasks/batch-spec.ts';
import { TaskDefaults, TaskFile, TaskSpec, resolveTask } from '../../src/tasks/task-spec.ts';
import type { z } from 'zod';

/** 300 runs a property in the suite; `npm run fuzz` sets FUZZ_RUNS (default there: 20,000). */
const RUNS = { numRuns: Number(process.env.FUZZ_RUNS ?? 300) };

/** Values a YAML file can give a field: anything JSON can hold, and strings long enough to be a file. */
const value = fc.oneof(fc.jsonValue({ maxDepth: 3 }), fc.string({ minLength: 81, maxLength: 300 }), fc.integer(), fc.double());

/** An object with some of the schema's keys (so the parser gets past the first check) and some others. */
function nearly(keys: string[]): fc.Arbitrary<Record<string, unknown>> {
  return fc
    .tuple(fc.dictionary(fc.constantFrom(...keys), value, { maxKeys: keys.length }), fc.dictionary(fc.string({ maxLength: 20 }), value, { maxKeys: 3 }))
    .map(([known, other]) => ({ ...other, ...known }));
}

const TASK_KEYS = ['id', 'instruction', 'image', 'workdir', 'verify', 'deadlineSec', 'limits', 'reserves'];
const BATCH_KEYS = ['name', 'tasks', 'samples', 'agent', 'defaults'];

/** Every long string anywhere in `input`: none of them may appear in a message. */
function longStrings(input: unknown, out: string[] = []): string[] {
  if (typeof input === 'string' && input.length > 80) out.push(input.slice(0, 60));
  else if (input !== null && typeof input === 'object') for (const v of Object.values(input)) longStrings(v, out);
  return out;
}

function checkParse(schema: z.ZodType, input: unknown): void {
  const parsed = schema.safeParse(input);
  if (parsed.success) return;
  const lines = describeIssues(parsed.error, input);
  expect(lines.length).toBeGreaterThan(0);
  for (const line of lines) {
    // "field.path: message (got ...)", the field being "(root)" for the document itself.
    expect(line).toMatch(/^(\(root\)|[^\s:][^:]*): .+ \(got .+\)$/s);
    expect(line).not.toMatch(/[\u0000-\u001f\u007f-\u009f]/);
    for (const long of longStrings(input)) expect(line).not.toContain(long);
  }
}

describe('task and batch schemas under arbitrary input', () => {
  it('TaskFile: parses or names a field for every problem', () => {
    fc.assert(fc.property(fc.oneof(fc.anything(), nearly(TASK_KEYS)), (input) => checkParse(TaskFile, input)), RUNS);
  });

  it('TaskSpec (what the worker parses): parses or names a field, also after resolution', () => {
    fc.assert(
      fc.property(nearly(TASK_KEYS), (input) => {
        checkParse(TaskSpec, input);
        const file = TaskFile.safeParse(input);
        if (file.success) checkParse(TaskSpec, resolveTask(file.data));
      }),
      RUNS,
    );
  });

  it('BatchFile, TaskDefaults and AgentSpec: parse or name a field', () => {
    const agent = fc.oneof(fc.anything(), nearly(['kind', 'command', 'model', 'maxTurns', 'contextWindowTokens', 'outputReserveTokens', 'bashTimeoutSec']).map((a) => ({ kind: 'llm', ...a })));
    fc.assert(
      fc.property(fc.oneof(fc.anything(), nearly(BATCH_KEYS)), agent, (input, a) => {
        checkParse(BatchFile, input);
        checkParse(TaskDefaults, input);
        checkParse(AgentSpec, a);
      }),
      RUNS,
    );
  });

  it('a valid task stays valid through resolution (the parser is not just refusing everything)', () => {
    const task = fc.record({
      id: fc.stringMatching(/^[a-z0-9][a-z0-9_-]{0,20}$/),
      instruction: fc.string({ minLength: 1, maxLength: 200 }),
      verify: fc.record({ command: fc.string({ minLength: 1, maxLength: 50 }), timeoutSec: fc.integer({ min: 1, max: 100 }) }),
      image: fc.constantFrom('busybox', 'rollout-fleet/sandbox:busybox', 'localhost:5000/a/b:c'),
      workdir: fc.constantFrom('/workspace', '/app', '/home/u/w'),
    });
    fc.assert(
      fc.property(task, (t) => {
        expect(TaskSpec.safeParse(resolveTask(TaskFile.parse(t))).success).toBe(true);
      }),
      RUNS,
    );
  });
});

const int = fc.integer({ min: 0, max: 1_000_000 });
const usage = fc.record({ promptTokens: int, completionTokens: int, totalTokens: int });
const event: fc.Arbitrary<AgentEvent> = fc.oneof(
  fc.record({ type: fc.constant('model_call' as const), turn: int, durationMs: int, usage, finishReason: fc.option(fc.string()) }),
  fc.record({ type: fc.constant('tool_call' as const), turn: int, name: fc.string(), ok: fc.boolean(), exitCode: fc.option(fc.integer({ min: -1, max: 255 })), durationMs: int }),
  fc.record({ type: fc.constant('checkpoint' as const), seq: int, turn: int, messages: fc.array(fc.jsonValue({ maxDepth: 2 }), { maxLength: 4 }), usage, agentMs: int }),
  fc.record({ type: fc.constant('final' as const), reason: fc.constantFrom('finished', 'stopped', 'max_turns', 'context', 'budget'), answer: fc.option(fc.string()), turns: int }),
  fc.record({ type: fc.constant('error' as const), kind: fc.constantFrom('model', 'agent'), message: fc.string() }),
);

/** `bytes` split at arbitrary points. */
function chunked(bytes: Buffer, cuts: number[]): Buffer[] {
  const at = [...new Set(cuts.map((c) => c % (bytes.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let start = 0;
  for (const cut of [...at, bytes.length]) {
    out.push(bytes.subarray(start, cut));
    start = cut;
  }
  return out;
}

describe('agent event protocol', () => {
  it('never throws on arbitrary bytes, lines or marker-prefixed junk', () => {
    const junk = fc.oneof(
      fc.uint8Array({ maxLength: 300 }).map((a) => Buffer.from(a)),
      fc.string().map((s) => Buffer.from(s)),
      fc.string().map((s) => Buffer.from(`${EVENT_MARKER}${s}\n`)),
      fc.jsonValue().map((v) => Buffer.from(`${EVENT_MARKER}${JSON.stringify(v)}\n`)),
    );
    fc.assert(
      fc.property(fc.array(junk, { maxLength: 10 }), fc.array(fc.nat(), { maxLength: 8 }), (parts, cuts) => {
        const parser = new AgentEventParser(() => undefined);
        for (const chunk of chunked(Buffer.concat(parts), cuts)) parser.push(chunk);
      }),
      RUNS,
    );
  });

  it('round-trips valid events through any chunking, among junk lines', () => {
    fc.assert(
      fc.property(fc.array(event, { minLength: 1, maxLength: 6 }), fc.array(fc.string().filter((s) => !s.includes(EVENT_MARKER.trim())), { maxLength: 6 }), fc.array(fc.nat(), { maxLength: 10 }), (events, junk, cuts) => {
        const lines = events.flatMap((e, i) => [`${(junk[i] ?? '').replace(/\n/g, ' ')}\n`, formatEvent(e)]);
        const received: AgentEvent[] = [];
        const parser = new AgentEventParser((e) => received.push(e));
        for (const chunk of chunked(Buffer.from(lines.join('')), cuts)) parser.push(chunk);
        expect(received).toEqual(events.map((e) => JSON.parse(JSON.stringify(e)) as AgentEvent));
        expect(parser.dropped).toBe(0);
      }),
      RUNS,
    );
  });
});
