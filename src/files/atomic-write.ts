// The fleet's one way to put a file on disk so that it survives a crash whole or not at all: content
// written to a temp name and fsynced, the name moved into place, the folder fsynced (without that last
// step the new name itself may be lost by a power cut). Two forms: replace (results, evidence,
// latest.json) and publish-once (content-addressed caches nobody may rewrite). The checkpoint store
// composes the same steps itself to overlap its fsyncs.
import { randomBytes } from 'node:crypto';
import { link, mkdir, open, rename, rm, stat, type FileHandle } from 'node:fs/promises';
import path from 'node:path';

/** Make the names created, renamed or removed in `dir` durable. */
export async function fsyncDir(dir: string): Promise<void> {
  const dh = await open(dir, 'r');
  try {
    await dh.sync();
  } finally {
    await dh.close();
  }
}

/** Write and fsync an open file, then close it (closed on failure too). */
export async function fillAndSync(fh: FileHandle, data: string | Uint8Array): Promise<void> {
  try {
    await fh.writeFile(data);
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Create `file` (it must not exist: temp names are never shared) with `data`, fsynced. */
export async function createDurable(file: string, data: string | Uint8Array): Promise<void> {
  await fillAndSync(await open(file, 'wx'), data);
}

/** Readers see the old content or the new, never a torn one, and the new survives a crash once this resolves. */
export async function writeFileAtomic(file: string, data: string | Uint8Array): Promise<void> {
  const dir = path.dirname(file);
  await mkdir(dir, { recursive: true });
  const tmp = path.join(dir, `.${path.basename(file)}.${randomBytes(4).toString('hex')}.tmp`);
  try {
    await createDurable(tmp, data);
    await rename(tmp, file);
  } catch (err) {
    await rm(tmp, { force: true }).catch(() => undefined);
    throw err;
  }
  await fsyncDir(dir);
}

/**
 * Move the finished `tmp` (written by anyone, another process included) to `target` unless `target`
 * exists already; `tmp` is gone either way. Concurrent processes (workers sharing a data folder) race
 * with link(2), which never replaces, so a published file never changes under a reader hashing it.
 * The content is fsynced before it gets its name: a crash cannot leave a torn file that every later
 * call would take for finished.
 */
export async function publishOnce(tmp: string, target: string): Promise<void> {
  try {
    const fh = await open(tmp, 'r');
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
    await link(tmp, target);
    await fsyncDir(path.dirname(target));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  } finally {
    await rm(tmp, { force: true });
  }
}

export async function exists(file: string): Promise<boolean> {
  return stat(file).then(() => true, () => false);
}
