// Packs a task folder into a deterministic tar: the same folder gives byte-identical archives on any
// machine (sorted entries, fixed mtime, uid, gid and modes), so its sha256 names the task's content
// and every episode records exactly what it ran. A folder too big for the store is refused from its
// sizes before a byte is read; digestTask hashes without keeping the archive, so a batch of many big
// tasks is checked in the memory of one.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { lstat, readdir, readlink } from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Writable } from 'node:stream';
import tar from 'tar-stream';
import { FleetError } from '../errors/fleet-error.ts';
import { printable } from '../errors/printable.ts';

/** What of a task folder goes into its archive: the fleet's format, then Harbor's (absent parts are skipped). */
export const TASK_PARTS = ['task.yaml', 'workspace', 'tests', 'solution', 'task.toml', 'instruction.md', 'environment'] as const;

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
  size: number;
}

async function walk(root: string, rel: string, out: Entry[]): Promise<void> {
  const abs = path.join(root, rel);
  const st = await lstat(abs).catch(() => undefined);
  if (st === undefined) return;
  if (st.isSymbolicLink()) {
    out.push({ rel, abs, type: 'symlink', executable: false, size: 0 });
  } else if (st.isDirectory()) {
    out.push({ rel, abs, type: 'directory', executable: true, size: 0 });
    const names = (await readdir(abs)).sort();
    for (const name of names) await walk(root, path.posix.join(rel, name), out);
  } else if (st.isFile()) {
    out.push({ rel, abs, type: 'file', executable: (st.mode & 0o111) !== 0, size: st.size });
  } else {
    throw new FleetError('invalid_task', `${printable(abs)}: not a regular file, folder or symlink (a FIFO, socket or device cannot be packed)`);
  }
}

const FIXED = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' } as const;

function tooLarge(dir: string, size: number): FleetError {
  return new FleetError(
    'invalid_task',
    `${printable(dir)}: workspace/, tests/ and solution/ make a task archive larger than ${MAX_TASK_ARCHIVE_BYTES} bytes (at least ${size} bytes; put big files in the image)`,
  );
}

/** The archive size the entries need at least: a 512-byte header each, data padded to 512, the end. */
function minimumArchiveBytes(entries: readonly Entry[]): number {
  return entries.reduce((sum, e) => sum + 512 + Math.ceil(e.size / 512) * 512, 1024);
}

/** Pack `dir` and hand each chunk of the archive to `onChunk`; returns the archive's sha256. */
async function packInto(dir: string, onChunk: (chunk: Buffer) => void): Promise<string> {
  const entries: Entry[] = [];
  for (const part of TASK_PARTS) await walk(dir, part, entries);
  const minimum = minimumArchiveBytes(entries);
  if (minimum > MAX_TASK_ARCHIVE_BYTES) throw tooLarge(dir, minimum);

  const pack = tar.pack();
  const hash = createHash('sha256');
  let size = 0;
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      size += chunk.length;
      // A file that grew after it was measured: refused here, not stored.
      if (size > MAX_TASK_ARCHIVE_BYTES) {
        cb(tooLarge(dir, size));
        return;
      }
      hash.update(chunk);
      onChunk(chunk);
      cb();
    },
  });
  const done = pipeline(pack, sink);
  // Every step races the whole pipeline: when the sink fails, the step waiting on it would never end,
  // and the failure is reported once, from here, never as an unhandled rejection.
  done.catch(() => undefined);
  const step = async (work: Promise<unknown>) => {
    work.catch(() => undefined);
    await Promise.race([work, done]);
  };
  try {
    for (const e of entries) {
      if (e.type === 'directory') {
        pack.entry({ ...FIXED, name: `${e.rel}/`, type: 'directory', mode: 0o755 });
      } else if (e.type === 'symlink') {
        pack.entry({ ...FIXED, name: e.rel, type: 'symlink', linkname: await readlink(e.abs), mode: 0o777 });
      } else {
        const entry = pack.entry({ ...FIXED, name: e.rel, type: 'file', size: e.size, mode: e.executable ? 0o755 : 0o644 });
        await step(pipeline(createReadStream(e.abs), entry));
      }
    }
    pack.finalize();
    await done;
  } catch (err) {
    pack.destroy();
    if (err instanceof FleetError) throw err;
    // A file changed or vanished while it was read.
    throw new FleetError('invalid_task', `${printable(dir)}: cannot pack the task: ${printable((err as Error).message)}`);
  }
  return hash.digest('hex');
}

/** Pack the task folder at `dir` (absolute). */
export async function packTask(dir: string): Promise<PackedTask> {
  const chunks: Buffer[] = [];
  const digest = await packInto(dir, (chunk) => chunks.push(chunk));
  return { digest, archive: Buffer.concat(chunks) };
}

/** The digest packTask would give, without keeping the archive in memory. */
export async function digestTask(dir: string): Promise<string> {
  return packInto(dir, () => undefined);
}
