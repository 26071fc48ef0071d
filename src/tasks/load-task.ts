// Reads task folders and batch files from disk and validates them. Every problem is reported as
// "<file>: <field>: <message> (got <value>)" so the user knows what to fix; nothing is enqueued from a
// batch that has any problem. Files are read as hostile: only regular files (a FIFO would block, a
// device never end), at most MAX_YAML_BYTES, and a file's content is never echoed back.
import { constants, lstatSync, type Stats } from 'node:fs';
import { lstat, open, readdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { parse as parseYaml } from 'yaml';
import type { z } from 'zod';
import { describeIssues } from '../config/zod-issues.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { printable } from '../errors/printable.ts';
import type { Redis } from 'ioredis';
import { BatchFile } from './batch-spec.ts';
import { getTaskArchive } from './task-store.ts';
import { HARBOR_FILES, resolveHarborTask, type HarborFolder, type HarborStepFolder, type HostEnv } from './harbor-task.ts';
import type { TaskArchive } from './task-archive.ts';
import { TaskFile, TaskSpec, resolveTask, type TaskDefaults } from './task-spec.ts';
import { isTerminalBench1Folder, mapTerminalBench1, Tb1Problem } from './terminal-bench-1.ts';

/** A task of a batch: a folder on this machine, or an archive already stored by its digest. */
export type LoadedTask =
  | {
      /** Absolute path of the task folder (for a Terminal-Bench 1 task, the Harbor folder it maps to). */
      dir: string;
      /** The folder the user named, when `dir` is a mapping of it. */
      from?: string;
      digest?: undefined;
      spec: TaskSpec;
    }
  | { dir?: undefined; from?: undefined; /** sha256 of the stored archive. */ digest: string; spec: TaskSpec };

/** Where stored task archives are read from (tasks named by digest). */
export interface ArchiveSource {
  redis: Redis;
  prefix: string;
}

export interface LoadedBatch {
  file: string;
  batch: BatchFile;
  tasks: LoadedTask[];
}

/** A batch file or task.yaml is a page of settings: the instruction is capped far below this. */
export const MAX_YAML_BYTES = 1024 * 1024;

function invalid(file: string, problems: string[]): FleetError {
  return new FleetError('invalid_task', problems.map((p) => `${printable(file)}: ${p}`).join('\n'));
}

function fileType(st: Stats): string {
  if (st.isDirectory()) return 'a folder';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isSocket()) return 'a socket';
  if (st.isCharacterDevice() || st.isBlockDevice()) return 'a device';
  if (st.isSymbolicLink()) return 'a symbolic link';
  return 'not a file';
}

/**
 * The text of a regular file of at most MAX_YAML_BYTES. O_NONBLOCK makes opening a FIFO return at
 * once (fstat then names it); with `noFollow`, a symbolic link is refused instead of followed.
 */
async function readBounded(file: string, noFollow: boolean): Promise<string> {
  let handle;
  try {
    handle = await open(file, constants.O_RDONLY | constants.O_NONBLOCK | (noFollow ? constants.O_NOFOLLOW : 0));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ELOOP' && noFollow) throw invalid(file, ['not a regular file (a symbolic link: the task archive would hold the link, not the file)']);
    throw invalid(file, [`cannot read: ${code ?? 'unknown error'}`]);
  }
  try {
    const st = await handle.stat();
    if (!st.isFile()) throw invalid(file, [`not a regular file (${fileType(st)})`]);
    if (st.size > MAX_YAML_BYTES) throw invalid(file, [`larger than ${MAX_YAML_BYTES} bytes (got ${st.size} bytes)`]);
    // One byte more than allowed tells a file that grew since fstat from one that did not.
    const buf = Buffer.alloc(MAX_YAML_BYTES + 1);
    let length = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buf, length, buf.length - length, null);
      if (bytesRead === 0) break;
      length += bytesRead;
      if (length > MAX_YAML_BYTES) throw invalid(file, [`larger than ${MAX_YAML_BYTES} bytes`]);
    }
    return buf.subarray(0, length).toString('utf8');
  } catch (err) {
    if (err instanceof FleetError) throw err;
    throw invalid(file, [`cannot read: ${(err as NodeJS.ErrnoException).code ?? 'unknown error'}`]);
  } finally {
    await handle.close();
  }
}

async function readYaml(file: string, noFollow: boolean): Promise<unknown> {
  return parseYamlText(await readBounded(file, noFollow), file);
}

function parseYamlText(text: string, file: string): unknown {
  try {
    // logLevel 'error': YAML warnings would go to stderr with a piece of the file.
    return parseYaml(text, { logLevel: 'error' });
  } catch (err) {
    // The first line only: the ones after it quote the file around the error.
    throw invalid(file, [`not valid YAML: ${printable((err as Error).message.split('\n')[0] ?? '')}`]);
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

/** Load one task folder (task.yaml, or Harbor's task.toml), resolved against the batch defaults. */
export async function loadTask(dir: string, defaults: TaskDefaults = {}, hostEnv: HostEnv = {}): Promise<LoadedTask & { dir: string }> {
  const abs = path.resolve(dir);
  if (await isTaskFolder(abs, 'task.toml') && !(await isTaskFolder(abs, 'task.yaml'))) return { dir: abs, spec: await loadHarborFolder(abs, defaults, hostEnv) };
  if (await isTerminalBench1Folder(abs)) {
    // Mapped to a Harbor folder (in a cache folder, never in the task's own), then loaded as one.
    let mapped: string;
    try {
      mapped = await mapTerminalBench1(abs, (file) => readBounded(file, true));
    } catch (err) {
      if (err instanceof Tb1Problem) throw invalid(path.join(abs, err.file), [err.message]);
      throw err;
    }
    return { dir: mapped, from: abs, spec: await loadHarborFolder(mapped, defaults, hostEnv, { name: path.basename(abs), where: abs }) };
  }
  const yamlFile = path.join(abs, 'task.yaml');
  const file = parseWith(TaskFile, await readYaml(yamlFile, true), yamlFile);
  const resolved = resolveTask(file, defaults);
  const spec = parseWith(TaskSpec, resolved, yamlFile);
  for (const required of ['workspace', 'tests']) {
    if (!(await isDir(path.join(abs, required)))) {
      throw invalid(abs, [`${required}/: missing (every task folder needs workspace/ and tests/)`]);
    }
  }
  return { dir: abs, spec };
}

async function isTaskFolder(dir: string, marker: 'task.yaml' | 'task.toml'): Promise<boolean> {
  return lstat(path.join(dir, marker)).then(() => true, () => false);
}

/** A regular file (not a link) inside `root`: a sidecar's Dockerfile the resolver checks synchronously. */
function isFileSync(p: string, root: string): boolean {
  const rel = path.relative(root, p);
  if (rel.startsWith('..') || path.isAbsolute(rel)) return false;
  // Every folder on the way must be a real folder of the task: a link to a folder outside it is not.
  const parts = rel.split(path.sep);
  try {
    let at = root;
    for (const [i, part] of parts.entries()) {
      at = path.join(at, part);
      const st = lstatSync(at);
      if (i < parts.length - 1 ? !st.isDirectory() : !st.isFile()) return false;
    }
    return true;
  } catch {
    return false;
  }
}

async function isFile(p: string): Promise<boolean> {
  return lstat(p).then((s) => s.isFile(), () => false);
}

/** A Harbor folder read from disk: task.toml and instruction.md as bounded regular files, the rest by presence. */
async function loadHarborFolder(dir: string, defaults: TaskDefaults, hostEnv: HostEnv, as: { name: string; where: string } = { name: path.basename(dir), where: dir }): Promise<TaskSpec> {
  const folder: HarborFolder = {
    name: as.name,
    tomlText: await readBounded(path.join(dir, HARBOR_FILES.toml), true),
    // A multi-step task may keep its instructions in steps/<name>/ only.
    instruction: await isDir(path.join(dir, 'steps')) && !(await isFile(path.join(dir, HARBOR_FILES.instruction)))
      ? ''
      : await readBounded(path.join(dir, HARBOR_FILES.instruction), true),
    has: {
      dockerfile: await isFile(path.join(dir, HARBOR_FILES.dockerfile)),
      compose: (await Promise.all(HARBOR_FILES.compose.map((f) => isFile(path.join(dir, f))))).some(Boolean),
      testScript: await isFile(path.join(dir, HARBOR_FILES.testScript)),
      testsDockerfile: await isFile(path.join(dir, HARBOR_FILES.testsDockerfile)),
    },
    ...(await isDir(path.join(dir, 'steps')) && { steps: await stepFolders(path.join(dir, 'steps')) }),
  };
  const composeFile = (await Promise.all(HARBOR_FILES.compose.map(async (f) => (await isFile(path.join(dir, f))) ? f : undefined))).find((f) => f !== undefined);
  if (composeFile !== undefined) {
    folder.composeText = await readBounded(path.join(dir, composeFile), true);
    folder.exists = (rel) => isFileSync(path.join(dir, ...rel.split('/')), dir);
  }
  return resolveHarbor(folder, as.where, defaults, hostEnv);
}

/** The folders of a multi-step task's steps/, each with its instruction.md (bounded) and what it holds. */
async function stepFolders(stepsDir: string): Promise<Record<string, HarborStepFolder>> {
  const out: Record<string, HarborStepFolder> = {};
  for (const d of await readdir(stepsDir, { withFileTypes: true })) {
    if (!d.isDirectory()) continue;
    const at = path.join(stepsDir, d.name);
    out[d.name] = {
      instruction: await isFile(path.join(at, 'instruction.md')) ? await readBounded(path.join(at, 'instruction.md'), true) : undefined,
      has: {
        workdir: await isDir(path.join(at, 'workdir')),
        setup: await isFile(path.join(at, 'workdir', 'setup.sh')),
        tests: await isDir(path.join(at, 'tests')),
        testScript: await isFile(path.join(at, 'tests', 'test.sh')),
        solution: await isFile(path.join(at, 'solution', 'solve.sh')),
      },
    };
  }
  return out;
}

/** The step folders of a stored archive (names from its entries under steps/). */
function archiveStepFolders(archive: TaskArchive): Record<string, HarborStepFolder> | undefined {
  const names = new Set<string>();
  for (const name of archive.names()) {
    const m = /^steps\/([^/]+)\//.exec(name);
    if (m) names.add(m[1]!);
  }
  if (names.size === 0) return undefined;
  const has = (f: string) => archive.readText(f) !== undefined;
  return Object.fromEntries([...names].map((n) => [n, {
    instruction: archive.readText(`steps/${n}/instruction.md`),
    has: {
      workdir: archive.has(`steps/${n}/workdir`),
      setup: has(`steps/${n}/workdir/setup.sh`),
      tests: archive.has(`steps/${n}/tests`),
      testScript: has(`steps/${n}/tests/test.sh`),
      solution: has(`steps/${n}/solution/solve.sh`),
    },
  }]));
}

/** A Harbor folder read from a stored archive (the API's way in: no `${VAR}` comes from this host). */
function harborFolderOf(archive: TaskArchive, name: string): HarborFolder | undefined {
  const tomlText = archive.readText(HARBOR_FILES.toml);
  if (tomlText === undefined) return undefined;
  const has = (f: string) => archive.readText(f) !== undefined;
  const composeFile = HARBOR_FILES.compose.find(has);
  return {
    name,
    tomlText,
    instruction: archive.readText(HARBOR_FILES.instruction) ?? '',
    has: {
      dockerfile: has(HARBOR_FILES.dockerfile),
      compose: HARBOR_FILES.compose.some(has),
      testScript: has(HARBOR_FILES.testScript),
      testsDockerfile: has(HARBOR_FILES.testsDockerfile),
    },
    ...(archiveStepFolders(archive) !== undefined && { steps: archiveStepFolders(archive)! }),
    ...(composeFile !== undefined && { composeText: archive.readText(composeFile) ?? '', exists: has }),
  };
}

function resolveHarbor(folder: HarborFolder, where: string, defaults: TaskDefaults, hostEnv: HostEnv): TaskSpec {
  const resolved = resolveHarborTask(folder, defaults, hostEnv, describeIssues);
  if (!resolved.ok) throw invalid(where, resolved.problems.map((p) => `${p.file}: ${p.message}`));
  return parseWith(TaskSpec, resolved.spec, path.join(where, HARBOR_FILES.toml));
}

/** A path from a batch file: a task folder, or a folder whose sub-folders with task.yaml are tasks. */
async function expandTaskPath(p: string, batchFile: string, index: number): Promise<string[]> {
  if (!(await isDir(p))) throw invalid(batchFile, [`tasks.${index}: not a folder (got ${printable(JSON.stringify(p))})`]);
  if (await isTaskFolder(p, 'task.yaml') || await isTaskFolder(p, 'task.toml')) return [p];
  const children = (await readdir(p, { withFileTypes: true }))
    .filter((d) => d.isDirectory())
    .map((d) => path.join(p, d.name))
    .sort();
  const tasks: string[] = [];
  for (const child of children) {
    if (await isTaskFolder(child, 'task.yaml') || await isTaskFolder(child, 'task.toml')) tasks.push(child);
  }
  if (tasks.length === 0) {
    throw invalid(batchFile, [`tasks.${index}: no task.yaml or task.toml in ${printable(JSON.stringify(p))} or its sub-folders`]);
  }
  return tasks;
}

/** The oracle runs solution/solve.sh: a task without it would fail on the worker, after the enqueue. */
async function checkOracleSolution(task: { dir: string; from?: string; spec: TaskSpec }): Promise<void> {
  const solve = path.join(task.dir, 'solution', 'solve.sh');
  // A multi-step task may give every step its own solution instead.
  const steps = task.spec.harbor?.steps;
  if (steps !== undefined && steps.every((s) => s.has.solution)) return;
  const ok = await stat(solve).then((s) => s.isFile(), () => false);
  if (task.from !== undefined && !ok) throw invalid(task.from, ['solution.sh: missing (the oracle agent runs it, or solution.yaml\'s keystrokes)']);
  if (!ok) throw invalid(task.dir, ['solution/solve.sh: missing (the oracle agent runs it; give the task a solution/ or use another agent)']);
}

/** The batch name a file's base name gives ("_hidden.yaml" gives "hidden"), or undefined (".yaml"). */
export function batchNameFromFile(file: string): string | undefined {
  const name = path
    .basename(file)
    .replace(/\.ya?ml$/i, '')
    .toLowerCase()
    .replace(/[^a-z0-9_-]/g, '-')
    .replace(/^[^a-z0-9]+/, '')
    .slice(0, 40);
  return name === '' ? undefined : name;
}

/** Where a batch comes from: its name in messages, the folder relative task paths start from, the store, `${VAR}` values. */
interface BatchSource {
  file: string;
  base?: string;
  archives?: ArchiveSource;
  /** Harbor's `${VAR}` in task.toml env tables are read from here; none for the API. @default none */
  hostEnv?: HostEnv;
}

/** Load and validate a batch file and every task it names. Throws on the first file with problems. */
export async function loadBatch(batchPath: string, archives?: ArchiveSource): Promise<LoadedBatch> {
  const file = path.resolve(batchPath);
  const parsed = parseWith(BatchFile, await readYaml(file, false), file);
  // A batch file on this machine: Harbor's `${VAR}` in task.toml env tables read this process's environment.
  return resolveBatch(parsed, { file, base: path.dirname(file), archives, hostEnv: process.env });
}

/**
 * Validate a batch given as an object (the client's and the API's way in) and every task it names.
 * `file` names the source in messages ("request"); `base` resolves relative task folders, and without
 * one a batch may name stored tasks only (the API must never read its own disk for a caller).
 */
export async function loadBatchObject(input: unknown, where: BatchSource): Promise<LoadedBatch> {
  return resolveBatch(parseWith(BatchFile, input, where.file), where);
}

/** The task a stored archive holds, resolved against the batch's defaults. */
async function loadStoredTask(digest: string, defaults: TaskDefaults, source: ArchiveSource, where: string): Promise<{ task: LoadedTask; hasSolution: boolean }> {
  let archive;
  try {
    archive = await getTaskArchive(source.redis, source.prefix, digest);
  } catch (err) {
    if (err instanceof FleetError && err.code === 'task_archive_missing') {
      throw new FleetError('task_archive_missing', `${printable(where)}: digest: no stored task has this digest (upload it first; stored tasks expire 30 days after their last use) (got ${JSON.stringify(digest)})`);
    }
    throw err;
  }
  const harbor = harborFolderOf(archive, `task-${digest.slice(0, 12)}`);
  if (harbor !== undefined && archive.readText('task.yaml') === undefined) {
    const spec = resolveHarbor(harbor, `${where} (task ${digest.slice(0, 12)})`, defaults, {});
    const steps = spec.harbor?.steps;
    return { task: { digest, spec }, hasSolution: archive.files('solution').has('solve.sh') || (steps !== undefined && steps.every((s) => s.has.solution)) };
  }
  const yamlFile = `${where} (task ${digest.slice(0, 12)}) task.yaml`;
  const text = archive.readText('task.yaml');
  if (text === undefined) throw invalid(yamlFile, ['missing']);
  const file = parseWith(TaskFile, parseYamlText(text, yamlFile), yamlFile);
  const spec = parseWith(TaskSpec, resolveTask(file, defaults), yamlFile);
  return { task: { digest, spec }, hasSolution: archive.files('solution').has('solve.sh') };
}

async function resolveBatch(parsed: BatchFile, where: BatchSource): Promise<LoadedBatch> {
  const { file } = where;
  const name = parsed.name ?? batchNameFromFile(file);
  if (name === undefined) throw invalid(file, ['name: missing, and the file name gives none: set name: (got nothing)']);
  const batch = { ...parsed, name };
  const tasks: LoadedTask[] = [];
  const seen = new Map<string, string>();
  const add = (task: LoadedTask) => {
    const source = task.from ?? task.dir ?? `task ${task.digest}`;
    const other = seen.get(task.spec.id);
    if (other !== undefined && other !== source) {
      throw invalid(file, [`tasks: id ${JSON.stringify(task.spec.id)} is used by both ${printable(other)} and ${printable(source)}`]);
    }
    if (other === undefined) tasks.push(task);
    seen.set(task.spec.id, source);
  };
  // A digest named again is the same task: fetched and resolved once (a batch may name one 10,000 times).
  const stored = new Map<string, Awaited<ReturnType<typeof loadStoredTask>>>();
  for (const [index, entry] of batch.tasks.entries()) {
    if (typeof entry !== 'string') {
      if (where.archives === undefined) throw invalid(file, [`tasks.${index}: a stored task needs the fleet's Redis (got ${JSON.stringify(entry.digest)})`]);
      const loaded = stored.get(entry.digest) ?? await loadStoredTask(entry.digest, batch.defaults, where.archives, `${file}: tasks.${index}`);
      stored.set(entry.digest, loaded);
      const { task, hasSolution } = loaded;
      if (batch.agent.kind === 'oracle' && !hasSolution) {
        throw invalid(file, [`tasks.${index}: solution/solve.sh: missing (the oracle agent runs it; give the task a solution/ or use another agent)`]);
      }
      add(task);
      continue;
    }
    if (where.base === undefined) throw invalid(file, [`tasks.${index}: a task folder is not accepted here; upload the task and name its digest (got ${printable(JSON.stringify(entry))})`]);
    for (const dir of await expandTaskPath(path.resolve(where.base, entry), file, index)) {
      const task = await loadTask(dir, batch.defaults, where.hostEnv ?? {});
      if (batch.agent.kind === 'oracle') await checkOracleSolution(task);
      add(task);
    }
  }
  return { file, batch, tasks };
}
