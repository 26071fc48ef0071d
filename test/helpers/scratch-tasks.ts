// Task folders and batch files written on the fly for tests.
import { mkdir, mkdtemp, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

export interface ScratchTask {
  yaml: string;
  /** Paths relative to the task folder (workspace/..., tests/..., solution/...) and their content. */
  files: Record<string, string>;
}

/** Write tasks and a batch file naming them; returns the batch file's path. */
export async function writeBatch(batchYaml: string, tasks: Record<string, ScratchTask>): Promise<string> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-scratch-'));
  for (const [name, task] of Object.entries(tasks)) {
    const taskDir = path.join(dir, 'tasks', name);
    await mkdir(path.join(taskDir, 'workspace'), { recursive: true });
    await mkdir(path.join(taskDir, 'tests'), { recursive: true });
    await writeFile(path.join(taskDir, 'task.yaml'), task.yaml);
    for (const [rel, content] of Object.entries(task.files)) {
      await mkdir(path.dirname(path.join(taskDir, rel)), { recursive: true });
      await writeFile(path.join(taskDir, rel), content);
    }
  }
  const file = path.join(dir, 'batch.yaml');
  await writeFile(file, batchYaml);
  return file;
}
