// Reads task folders and batch files from disk and validates them. Every problem is reported as
// "<file>: <field>: <message> (got <value>)" so the user knows what to fix; nothing is enqueued from a
// batch that has any problem.
import { readFile, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';
import { describeIssues } from '../config/zod-issues.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { BatchFile } from './batch-spec.ts';
import { TaskFile, TaskSpec, resolveTask, type TaskDefaults } from './task-spec.ts';

export interface LoadedTask {
  /** Absolute path of the task folder. */
  dir: string;
  spec: TaskSpec;
}

export interface LoadedBatch {
  file: string;
  batch: BatchFile;
  tasks: LoadedTask[];
}

function invalid(file: string, problems: string[]): FleetError {
  return new FleetError('invalid_task', problems.map((p) => `${file}: ${p}`).join('\n'));
}

async function readYaml(file: string): Promise<unknown> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch (err) {
    throw invalid(file, [`cannot read: ${(err as NodeJS.ErrnoException).code ?? String(err)}`]);
  }
  try {
    return parseYaml(text);
  } catch (err) {
    throw invalid(file, [`not valid YAML: ${(err as Error).message.split('\n')[0]}`]);
  }
}

function parseWith<S extends z.ZodType>(schema: S, input: unknown, file: string): z.infer<S> {
  const parsed = schema.safeParse(input);
  if (!parsed.success) throw invalid(file, describeIssues(parsed.error, input));
  return parsed.data;
}

async function isDir(p: string): Promise<boolean> {
  return stat(p).then((s) => s.isDirectory(), () => false);
}

/** Load one task folder, resolved against the batch defaults. */
export async function loadTask(dir: string, defaults: TaskDefaults = {}): Promise<LoadedTask> {
  const abs = path.resolve(dir);
  const yamlFile = path.join(abs, 'task.yaml');
  const file = parseWith(TaskFile, await readYaml(yamlFile), yamlFile);
  const resolved = resolveTask(file, defaults);
  const spec = parseWith(TaskSpec, resolved, yamlFile);
  for (const required of ['workspace', 'tests']) {
    if (!(await isDir(path.join(abs, required)))) {
      throw invalid(abs, [`${required}/: missing (every task folder needs workspace/ and tests/)`]);
    }
  }
  return { dir: abs, spec };
}

/** A path from a batch file: a task folder, or a folder whose sub-folders with task.yaml are tasks. */
async function expandTaskPath(p: string, batchFile: string, index: number): Promise<string[]> {
  if (!(await isDir(p))) throw invalid(batchFile, [`tasks.${index}: not a folder (got ${JSON.stringify(p)})`]);
  if (await stat(path.join(p, 'task.yaml')).then(() => true, () => false)) return [p];
  const children = (await readdir(p, { withFileTypes: true }))
    .filter((d) => d.isDirectory())
    .map((d) => path.join(p, d.name))
    .sort();
  const tasks: string[] = [];
  for (const child of children) {
    if (await stat(path.join(child, 'task.yaml')).then(() => true, () => false)) tasks.push(child);
  }
  if (tasks.length === 0) {
    throw invalid(batchFile, [`tasks.${index}: no task.yaml in ${JSON.stringify(p)} or its sub-folders`]);
  }
  return tasks;
}

/** Load and validate a batch file and every task it names. Throws on the first file with problems. */
export async function loadBatch(batchPath: string): Promise<LoadedBatch> {
  const file = path.resolve(batchPath);
  const batch = parseWith(BatchFile, await readYaml(file), file);
  const base = path.dirname(file);
  const dirs: string[] = [];
  for (const [index, p] of batch.tasks.entries()) {
    dirs.push(...(await expandTaskPath(path.resolve(base, p), file, index)));
  }
  const tasks: LoadedTask[] = [];
  const seen = new Map<string, string>();
  for (const dir of dirs) {
    const task = await loadTask(dir, batch.defaults);
    const other = seen.get(task.spec.id);
    if (other !== undefined && other !== dir) {
      throw invalid(file, [`tasks: id ${JSON.stringify(task.spec.id)} is used by both ${other} and ${dir}`]);
    }
    if (other === undefined) tasks.push(task);
    seen.set(task.spec.id, dir);
  }
  return { file, batch, tasks };
}
