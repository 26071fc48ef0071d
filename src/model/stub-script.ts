// The scripted policy: which tool call a task's episode gets at a given turn. Pure and stateless: the
// turn comes from the conversation the request carries, so a resumed conversation continues where it
// was, and the same (episode, task, turn) always gets the same answer.
//
// Solving script (n = number of solution files):
//   turns 0..n-1  write_file .solution/<rel> (relative: in the workdir) with each file of solution/
//   turn n        bash "cd <workdir> && SOLUTION_DIR=.solution sh .solution/solve.sh"
//   turn n+1      finish
// Wrong script (an episode picked by --wrong-fraction, or a task without solution/solve.sh):
//   turn 0 bash "cd <workdir> && ls -la", turn 1 finish without solving.
// After the script: a plain assistant message with no tool call.
import { createHash } from 'node:crypto';
import { shellQuote } from '../files/shell-quote.ts';
import type { ChatMessage, ToolInvocation } from './chat-protocol.ts';
import type { StubTask } from './stub-tasks.ts';

/**
 * Where the scripted policy writes the solution inside the sandbox: relative, so inside the workdir,
 * where a checkpoint's workspace snapshot keeps it for a resumed attempt.
 */
export const STUB_SOLUTION_DIR = '.solution';
export const STUB_BASH_TIMEOUT_SEC = 60;


/** The turn a request is at: how many assistant messages the conversation already has. */
export function turnOf(messages: readonly ChatMessage[]): number {
  return messages.filter((m) => m.role === 'assistant').length;
}

/** A number in [0, 1) fixed by the episode id. */
export function episodeFraction(episodeId: string): number {
  return createHash('sha256').update(episodeId).digest().readUInt32BE(0) / 2 ** 32;
}

/** Whether an episode gets the wrong script: a deterministic `fraction` of episode ids. */
export function isWrongEpisode(episodeId: string | undefined, fraction: number): boolean {
  if (episodeId === undefined || episodeId === '' || fraction <= 0) return false;
  return episodeFraction(episodeId) < fraction;
}

/** The tool call of `turn`, or undefined once the script is over. */
export function scriptedTurn(task: StubTask, turn: number, wrong: boolean): ToolInvocation | undefined {
  const workdir = shellQuote(task.workdir);
  const files = task.solution;
  if (wrong || files === undefined) {
    const steps: ToolInvocation[] = [
      { name: 'bash', arguments: { command: `cd ${workdir} && ls -la`, timeoutSec: STUB_BASH_TIMEOUT_SEC } },
      { name: 'finish', arguments: { answer: files === undefined ? 'There is no reference solution for this task; giving up.' : 'I looked around but did not change anything.' } },
    ];
    return steps[turn];
  }
  if (turn < files.length) {
    const file = files[turn]!;
    return { name: 'write_file', arguments: { path: `${STUB_SOLUTION_DIR}/${file.rel}`, content: file.content } };
  }
  if (turn === files.length) {
    return {
      name: 'bash',
      arguments: { command: `cd ${workdir} && SOLUTION_DIR=${STUB_SOLUTION_DIR} sh ${STUB_SOLUTION_DIR}/solve.sh`, timeoutSec: STUB_BASH_TIMEOUT_SEC },
    };
  }
  if (turn === files.length + 1) return { name: 'finish', arguments: { answer: 'Applied the fix with solve.sh.' } };
  return undefined;
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((part) => (typeof (part as { text?: unknown })?.text === 'string' ? (part as { text: string }).text : '')).join('\n');
  }
  return '';
}

/** The task whose instruction appears in a user (or system) message; the longest match wins. */
export function taskByInstruction(tasks: Iterable<StubTask>, messages: readonly ChatMessage[]): StubTask | undefined {
  const texts = messages.filter((m) => m.role === 'user' || m.role === 'system').map((m) => textOf(m.content));
  let best: StubTask | undefined;
  for (const task of tasks) {
    const needle = task.instruction.trim();
    if (texts.some((t) => t.includes(needle)) && (best === undefined || needle.length > best.instruction.trim().length)) best = task;
  }
  return best;
}
