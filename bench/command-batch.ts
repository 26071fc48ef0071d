// What the whole-fleet benches share: a batch of one small command-agent task written to a scratch
// folder, and a poll that waits for a condition (benches wait on state, never a fixed time).
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';

/** Poll `check` every `everyMs` until it holds; throw naming `what` after `timeoutMs`. */
export async function poll(what: string, timeoutMs: number, check: () => Promise<boolean>, everyMs = 100): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * A batch file `<dir>/<name>.yaml` of `samples` episodes of one task whose verifier passes when the
 * agent (`command`) wrote `fixed` into state.txt. Named per run, so each run gets its own batch id.
 */
export async function writeCommandBatch(dir: string, name: string, opts: { samples: number; command: string }): Promise<string> {
  const task = path.join(dir, 'tasks', 'fix');
  await mkdir(path.join(task, 'workspace'), { recursive: true });
  await mkdir(path.join(task, 'tests'), { recursive: true });
  await writeFile(path.join(task, 'workspace', 'state.txt'), 'broken\n');
  await writeFile(path.join(task, 'tests', 'test.sh'), 'grep -qx fixed state.txt\n');
  await writeFile(path.join(task, 'task.yaml'),
    'id: fix\ninstruction: write fixed into state.txt\nverify:\n  command: sh /tests/test.sh\n  timeoutSec: 20\ndeadlineSec: 300\nreserves: { setupSec: 60, verifySec: 30, closeSec: 30 }\n');
  const file = path.join(dir, `${name}.yaml`);
  await writeFile(file, `name: ${name}\ntasks: [tasks]\nsamples: ${opts.samples}\nagent: { kind: command, command: ${JSON.stringify(opts.command)} }\n`
    + 'defaults:\n  limits: { memoryMb: 128, cpus: 0.5, pids: 64 }\n');
  return file;
}

/** An integer option of parseArgs' values, at least `min`; a clear error naming the option otherwise. */
export function intOption<V extends Record<string, unknown>>(values: V, name: keyof V & string, min = 1): number {
  const n = Number(values[name]);
  if (!Number.isInteger(n) || n < min) throw new TypeError(`--${name}: expected an integer from ${min} up, got ${JSON.stringify(values[name])}`);
  return n;
}
