// The task packer as it was before src/archive/pack-folder.ts (tar-stream, one file after another),
// kept only as the reference the new packer's bytes are compared with (test/unit/pack-folder.test.ts)
// and timed against (bench/pack-folder.ts). Task digests already recorded name these bytes, so any
// difference is a bug in the new packer, never in this one. Refusals are plain Errors here: only the
// bytes are compared.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { lstat, readdir, readlink } from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { Writable } from 'node:stream';
import tar from 'tar-stream';

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
    throw new Error(`${abs}: not a regular file, folder or symlink`);
  }
}

const FIXED = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' } as const;

/** The archive of `parts` of `root` exactly as the previous packTask made it, and its sha256. */
export async function legacyPack(root: string, parts: readonly string[], maxBytes: number): Promise<{ digest: string; archive: Buffer }> {
  const entries: Entry[] = [];
  for (const part of parts) await walk(root, part, entries);
  const minimum = entries.reduce((sum, e) => sum + 512 + Math.ceil(e.size / 512) * 512, 1024);
  if (minimum > maxBytes) throw new Error(`${root}: larger than ${maxBytes} bytes (at least ${minimum})`);
  const pack = tar.pack();
  const hash = createHash('sha256');
  const chunks: Buffer[] = [];
  let size = 0;
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      size += chunk.length;
      if (size > maxBytes) {
        cb(new Error(`${root}: larger than ${maxBytes} bytes (at least ${size})`));
        return;
      }
      hash.update(chunk);
      chunks.push(chunk);
      cb();
    },
  });
  const done = pipeline(pack, sink);
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
    throw err;
  }
  return { digest: hash.digest('hex'), archive: Buffer.concat(chunks) };
}
