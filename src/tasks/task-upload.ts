// Storing a task so batches can name it by digest: from a folder (the TypeScript client), or from a tar
// sent to the API (POST /v1/tasks). An upload is read as hostile: plain files and folders only (no
// links, devices or FIFOs), no absolute names and no `..`, only task.yaml, workspace/, tests/ and
// solution/ at the top, bounded in size and entries. It is unpacked into a private temporary folder and
// then checked and packed exactly as a task folder on disk is, so the digest is the one `enqueue` gives
// the same folder.
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { collectBytes } from '../archive/tar-buffer.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { printable } from '../errors/printable.ts';
import { loadTask, type ArchiveSource } from './load-task.ts';
import { MAX_TASK_ARCHIVE_BYTES, TASK_PARTS, packTask } from './pack-task.ts';
import { putTaskArchive } from './task-store.ts';

/** Entries one uploaded task may hold. */
export const MAX_UPLOAD_ENTRIES = 10_000;

export interface StoredTask {
  /** sha256 of the task archive: what a batch names. */
  digest: string;
  /** The task's id from its task.yaml. */
  taskId: string;
  /** Size of the stored archive. */
  bytes: number;
}

/** Check, pack and store the task folder `dir`. */
export async function storeTaskFolder(dir: string, source: ArchiveSource): Promise<StoredTask> {
  const task = await loadTask(dir);
  const packed = await packTask(task.dir);
  await putTaskArchive(source.redis, source.prefix, packed);
  return { digest: packed.digest, taskId: task.spec.id, bytes: packed.archive.length };
}

const refuse = (message: string) => new FleetError('invalid_task', `body: ${message}`);

/** A name as messages show it: quoted, escaped, and cut after 100 characters (a 1 MiB name is not sent back). */
function shown(name: string): string {
  const cut = name.length > 100 ? `${name.slice(0, 100)}...` : name;
  return `${printable(JSON.stringify(cut.replaceAll('\0', '\\0')))}${name.length > 100 ? ` (${Buffer.byteLength(name)} bytes)` : ''}`;
}

/** Linux's limits: 255 bytes a name, 4096 a path. */
const MAX_SEGMENT_BYTES = 255;
const MAX_PATH_BYTES = 4_000;

/** The entry's path inside the task, or undefined for the archive's own root ("./"). */
function entryPath(raw: string): string | undefined {
  if (raw.includes('\0')) throw refuse(`${shown(raw)}: a name with a NUL byte`);
  if (raw.startsWith('/')) throw refuse(`${shown(raw)}: an absolute name (names are relative to the task folder)`);
  const segments = raw.split('/').filter((s) => s !== '' && s !== '.');
  if (segments.includes('..')) throw refuse(`${shown(raw)}: a name with .. (it would leave the task folder)`);
  if (Buffer.byteLength(raw) > MAX_PATH_BYTES || segments.some((s) => Buffer.byteLength(s) > MAX_SEGMENT_BYTES)) {
    throw refuse(`${shown(raw)}: a name too long for a file system (at most ${MAX_SEGMENT_BYTES} bytes a part, ${MAX_PATH_BYTES} in all)`);
  }
  if (segments.length === 0) return undefined;
  const [top] = segments as [string];
  if (!(TASK_PARTS as readonly string[]).includes(top)) {
    throw refuse(`${shown(raw)}: not part of a task (only task.yaml, workspace/, tests/ and solution/, or Harbor's task.toml, instruction.md, environment/, tests/ and solution/, at the top: tar the folder's contents, e.g. tar -C my-task -cf - .)`);
  }
  return segments.join('/');
}

/**
 * The entries of an upload, counted without writing any (at most one past the cap): an archive of too
 * many is refused before a file is made, not after the cap's worth was written and removed again.
 * It walks the tar's 512-byte headers in the buffer, jumping over each body by its size: 20,000
 * entries in a few milliseconds, where a parser's promise per entry held the API's event loop for a
 * second. Extended headers (PAX `x`/`g`, GNU `L`/`K`) describe the next entry and are not counted, as
 * the parser does not report them. It stops at the end marker or at anything it cannot read; the
 * unpack then says what is wrong, and still enforces the cap itself.
 */
export function countTarEntries(body: Buffer, stopAfter = MAX_UPLOAD_ENTRIES + 1): number {
  let n = 0;
  for (let at = 0; at + 512 <= body.length && n < stopAfter; ) {
    const header = body.subarray(at, at + 512);
    if (header.every((b) => b === 0)) break;
    const sizeField = header.subarray(124, 136);
    if ((sizeField[0]! & 0x80) !== 0) break; // base-256 size: more than any upload may hold
    const size = parseInt(sizeField.toString('latin1').replace(/[\0 ]+$/, '').trim() || '0', 8);
    if (!Number.isSafeInteger(size) || size < 0) break;
    const type = String.fromCharCode(header[156]!);
    if (!'xgLK'.includes(type)) n += 1;
    at += 512 + Math.ceil(size / 512) * 512;
  }
  return n;
}

/** Unpack an uploaded task tar into `dir` (empty, private), refusing anything a task folder cannot hold. */
async function unpackUpload(body: Buffer, dir: string): Promise<void> {
  if (body.length > MAX_TASK_ARCHIVE_BYTES) throw refuse(`larger than ${MAX_TASK_ARCHIVE_BYTES} bytes (got ${body.length} bytes)`);
  if (body.length >= 2 && body[0] === 0x1f && body[1] === 0x8b) throw refuse('a gzip stream: send the plain tar (Content-Type: application/x-tar)');
  if (countTarEntries(body) > MAX_UPLOAD_ENTRIES) throw refuse(`more than ${MAX_UPLOAD_ENTRIES} entries`);
  const extract = tar.extract();
  let entries = 0;
  const made = new Set<string>();
  try {
    for await (const entry of Readable.from([body]).pipe(extract)) {
      const { header } = entry;
      if (++entries > MAX_UPLOAD_ENTRIES) throw refuse(`more than ${MAX_UPLOAD_ENTRIES} entries`);
      const rel = entryPath(header.name);
      if (header.type !== 'file' && header.type !== 'contiguous-file' && header.type !== 'directory') {
        const what = header.type === 'symlink' || header.type === 'link' ? 'a link (links are not accepted in an upload)' : `a ${header.type ?? 'special'} entry (only files and folders)`;
        throw refuse(`${shown(header.name)}: ${what}`);
      }
      if (rel === undefined) {
        if (header.type !== 'directory') throw refuse(`${shown(header.name)}: a file in place of the task folder`);
        entry.resume();
        continue;
      }
      const target = path.join(dir, rel);
      // What the file system says is told in the entry's words, never with the server's paths.
      const cannot = (err: NodeJS.ErrnoException) => {
        const why = { EEXIST: 'named twice in the archive', EISDIR: 'a file where a folder is', ENOTDIR: 'a folder where a file is', ENAMETOOLONG: 'a name too long for a file system' }[err.code ?? ''];
        return refuse(`${shown(header.name)}: ${why ?? `cannot be unpacked (${err.code ?? 'error'})`}`);
      };
      if (header.type === 'directory') {
        await mkdir(target, { recursive: true }).catch((err: NodeJS.ErrnoException) => Promise.reject(cannot(err)));
        entry.resume();
        continue;
      }
      // One mkdir per folder, not per file: an upload of 20,000 files in a few folders makes 20,000 fewer calls.
      const parent = path.dirname(target);
      if (!made.has(parent)) {
        await mkdir(parent, { recursive: true }).catch((err: NodeJS.ErrnoException) => Promise.reject(cannot(err)));
        made.add(parent);
      }
      const data = await collectBytes(entry);
      // wx: an archive that names one file twice is refused, not silently resolved.
      await writeFile(target, data, { flag: 'wx', mode: ((header.mode ?? 0o644) & 0o111) !== 0 ? 0o755 : 0o644 }).catch((err: NodeJS.ErrnoException) => Promise.reject(cannot(err)));
    }
  } catch (err) {
    extract.destroy();
    if (err instanceof FleetError) throw err;
    throw refuse(`not a readable tar archive (${printable((err as Error).message.slice(0, 200))})`);
  }
  if (entries === 0) throw refuse('an empty archive (expected task.yaml, workspace/ and tests/)');
}

/** Check, pack and store a task uploaded as a tar of its folder's contents. */
export async function storeUploadedTask(body: Buffer, source: ArchiveSource): Promise<StoredTask> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-upload-'));
  try {
    await unpackUpload(body, dir);
    // Said before the task is read: a task without its task.yaml is the sender's mistake, not an I/O error.
    if (!existsSync(path.join(dir, 'task.yaml')) && !existsSync(path.join(dir, 'task.toml'))) {
      throw refuse("task.yaml: not in the archive (nor Harbor's task.toml): a task's tar has task.yaml at its top; tar the folder's contents, e.g. tar -C my-task -cf - .");
    }
    return await storeTaskFolder(dir, source);
  } catch (err) {
    // Messages about the temporary folder speak of the upload instead.
    if (err instanceof FleetError && err.message.includes(dir)) {
      throw new FleetError(err.code, err.message.replaceAll(`${dir}/`, 'body: ').replaceAll(dir, 'body'));
    }
    throw err;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
