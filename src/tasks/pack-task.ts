// Packs a task folder into a deterministic tar: the same folder gives byte-identical archives on any
// machine (sorted entries, fixed mtime, uid, gid and modes), so its sha256 names the task's content
// and every episode records exactly what it ran.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { lstat, readdir, readlink } from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Writable } from 'node:stream';
import tar from 'tar-stream';
import { FleetError } from '../errors/fleet-error.ts';

/** What of a task folder goes into its archive. */
export const TASK_PARTS = ['task.yaml', 'workspace', 'tests', 'solution'] as const;

/** Task archives live in Redis; keep them small (images are for big environments). */
export const MAX_TASK_ARCHIVE_BYTES = 32 * 1024 * 1024;

export interface PackedTask {
  /** sha256 of the archive bytes, hex. */
  digest: string;
  archive: Buffer;
}

interface Entry {
  rel: string;
  abs: string;
  type: 'file' | 'directory' | 'symlink';
  executable: boolean;
}

async function walk(root: string, rel: string, out: Entry[]): Promise<void> {
  const abs = path.join(root, rel);
  const st = await lstat(abs).catch(() => undefined);
  if (st === undefined) return;
  if (st.isSymbolicLink()) {
    out.push({ rel, abs, type: 'symlink', executable: false });
  } else if (st.isDirectory()) {
    out.push({ rel, abs, type: 'directory', executable: true });
    const names = (await readdir(abs)).sort();
    for (const name of names) await walk(root, path.posix.join(rel, name), out);
  } else if (st.isFile()) {
    out.push({ rel, abs, type: 'file', executable: (st.mode & 0o111) !== 0 });
  } else {
    throw new FleetError('invalid_task', `${abs}: not a regular file, folder or symlink`);
  }
}

const FIXED = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' } as const;

/** Pack the task folder at `dir` (absolute). */
export async function packTask(dir: string): Promise<PackedTask> {
  const entries: Entry[] = [];
  for (const part of TASK_PARTS) await walk(dir, part, entries);

  const pack = tar.pack();
  const chunks: Buffer[] = [];
  const hash = createHash('sha256');
  let size = 0;
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      size += chunk.length;
      if (size > MAX_TASK_ARCHIVE_BYTES) {
        cb(new FleetError('invalid_task', `${dir}: task archive is larger than ${MAX_TASK_ARCHIVE_BYTES} bytes`));
        return;
      }
      hash.update(chunk);
      chunks.push(chunk);
      cb();
    },
  });
  const done = pipeline(pack, sink);

  for (const e of entries) {
    if (e.type === 'directory') {
      pack.entry({ ...FIXED, name: `${e.rel}/`, type: 'directory', mode: 0o755 });
    } else if (e.type === 'symlink') {
      pack.entry({ ...FIXED, name: e.rel, type: 'symlink', linkname: await readlink(e.abs), mode: 0o777 });
    } else {
      const st = await lstat(e.abs);
      const entry = pack.entry({ ...FIXED, name: e.rel, type: 'file', size: st.size, mode: e.executable ? 0o755 : 0o644 });
      await pipeline(createReadStream(e.abs), entry);
    }
  }
  pack.finalize();
  await done;
  return { digest: hash.digest('hex'), archive: Buffer.concat(chunks) };
}
