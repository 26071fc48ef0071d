// The tasks the scripted policy server knows: task folders under one directory, read on the host with
// their reference solution (every file of solution/, as text), so the stub can type it into a sandbox.
import { readFile, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { FleetError } from '../errors/fleet-error.ts';
import { loadTask } from '../tasks/load-task.ts';

export interface SolutionFile {
  /** Path below solution/, with forward slashes. */
  rel: string;
  content: string;
}

export interface StubTask {
  id: string;
  instruction: string;
  workdir: string;
  /** The files of solution/, sorted by path; undefined when the task has no solution/solve.sh. */
  solution: SolutionFile[] | undefined;
}

const exists = (p: string) => stat(p).then(() => true, () => false);

async function listFiles(dir: string, prefix = ''): Promise<string[]> {
  const out: string[] = [];
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const rel = prefix === '' ? entry.name : `${prefix}/${entry.name}`;
    if (entry.isDirectory()) out.push(...(await listFiles(path.join(dir, entry.name), rel)));
    else if (entry.isFile()) out.push(rel);
  }
  return out;
}

async function readSolution(taskDir: string): Promise<SolutionFile[] | undefined> {
  const dir = path.join(taskDir, 'solution');
  if (!(await exists(path.join(dir, 'solve.sh')))) return undefined;
  const files: SolutionFile[] = [];
  for (const rel of (await listFiles(dir)).sort()) {
    const bytes = await readFile(path.join(dir, rel));
    const content = bytes.toString('utf8');
    // write_file carries text; a file that is not UTF-8 would arrive altered, so refuse it up front.
    if (!Buffer.from(content, 'utf8').equals(bytes)) {
      throw new FleetError('invalid_task', `${path.join(dir, rel)}: not UTF-8 text; the scripted policy can only write text files`);
    }
    files.push({ rel, content });
  }
  return files;
}

/** A folder of the fleet's own format (task.yaml) or a Harbor task (task.toml). */
const isTaskDir = async (dir: string) => (await exists(path.join(dir, 'task.yaml'))) || (await exists(path.join(dir, 'task.toml')));

/** Load `dir` itself if it is a task folder, else every sub-folder with a task.yaml or task.toml; keyed by task id. */
export async function loadStubTasks(dir: string): Promise<Map<string, StubTask>> {
  const root = path.resolve(dir);
  let taskDirs: string[];
  if (await isTaskDir(root)) {
    taskDirs = [root];
  } else {
    const entries = await readdir(root, { withFileTypes: true }).catch((err: NodeJS.ErrnoException) => {
      throw new FleetError('invalid_task', `${root}: cannot read the tasks folder (${err.code ?? err.message})`);
    });
    taskDirs = [];
    for (const e of entries.filter((d) => d.isDirectory()).sort((a, b) => a.name.localeCompare(b.name))) {
      if (await isTaskDir(path.join(root, e.name))) taskDirs.push(path.join(root, e.name));
    }
  }
  if (taskDirs.length === 0) throw new FleetError('invalid_task', `${root}: no task.yaml or task.toml in it or its sub-folders`);
  const tasks = new Map<string, StubTask>();
  for (const taskDir of taskDirs) {
    const { spec } = await loadTask(taskDir);
    if (tasks.has(spec.id)) throw new FleetError('invalid_task', `${taskDir}: task id ${JSON.stringify(spec.id)} is used twice under ${root}`);
    tasks.set(spec.id, { id: spec.id, instruction: spec.instruction, workdir: spec.workdir, solution: await readSolution(taskDir) });
  }
  return tasks;
}
