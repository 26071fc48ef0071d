// The runtime builder's two operations, streaming with flat memory: hash files (two reused 1 MiB
// buffers, the next read in flight while the last one is hashed) and write a planned tar with
// tar-stream. They run in the builder thread (archive-worker.ts), which runs compiled JavaScript
// (see build-off-thread.ts), so it imports only node: modules, tar-stream and types.
//
// A file must not change between hashing and archiving, or the archive would not match its generation
// id. Both steps record the file's stat identity (device, inode, size, mtime, ctime in ns; what make and
// git rely on) before and after reading it, and fail if it moved; a rewrite changes ctime, a
// replacement changes the inode. This costs two stats where a second sha256 pass would cost ~0.1 s.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open, stat } from 'node:fs/promises';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';

import type { ArchiveSummary, FileDigest, FileSource, PlannedEntry } from './archive-protocol.ts';

const READ_CHUNK_BYTES = 1024 * 1024;

/** Root owns everything and every timestamp is the epoch: only names, modes and bytes reach the archive. */
const FIXED_HEADER = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' };

/** A file's stat identity (symlinks followed): any write or replacement changes it. */
export async function fileIdentity(file: string): Promise<string> {
  const st = await stat(file, { bigint: true });
  return `${st.dev}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}`;
}

const changed = (name: string) => new Error(`${name} changed while its generation was being built; its archive would not match its id`);

async function hashSource(source: string, bufs: [Buffer, Buffer], signal: AbortSignal | undefined): Promise<FileDigest> {
  const hash = createHash('sha256');
  let size = 0;
  const identity = await fileIdentity(source);
  const fh = await open(source, 'r');
  let next: Promise<{ bytesRead: number }> | undefined;
  try {
    let [full, spare] = bufs;
    next = fh.read(full, 0, READ_CHUNK_BYTES, null);
    for (;;) {
      const { bytesRead } = await next;
      next = undefined;
      if (bytesRead === 0) break;
      signal?.throwIfAborted();
      next = fh.read(spare, 0, READ_CHUNK_BYTES, null);
      hash.update(full.subarray(0, bytesRead));
      size += bytesRead;
      [full, spare] = [spare, full];
    }
  } finally {
    await next?.catch(() => undefined);
    await fh.close();
  }
  if ((await fileIdentity(source)) !== identity) throw changed(source);
  return { size, sha256: hash.digest('hex'), identity };
}

/** Size, sha256 and (for host files) stat identity of each file, in order. */
export async function hashFiles(files: FileSource[], signal?: AbortSignal): Promise<FileDigest[]> {
  const bufs: [Buffer, Buffer] = [Buffer.allocUnsafe(READ_CHUNK_BYTES), Buffer.allocUnsafe(READ_CHUNK_BYTES)];
  const digests: FileDigest[] = [];
  for (const file of files) {
    if ('content' in file) {
      const bytes = Buffer.from(file.content, 'utf8');
      digests.push({ size: bytes.length, sha256: createHash('sha256').update(bytes).digest('hex') });
      continue;
    }
    try {
      digests.push(await hashSource(file.source, bufs, signal));
    } catch (err) {
      if (signal?.aborted) throw err;
      throw new Error(`cannot read ${file.source}: ${(err as Error).message}`, { cause: err });
    }
  }
  return digests;
}

/** Counts a file's bytes on their way into the archive and fails on any other size than planned. */
function sized(name: string, size: number): Transform {
  let seen = 0;
  return new Transform({
    transform(chunk: Buffer, _enc, cb) {
      seen += chunk.length;
      cb(seen > size ? changed(name) : null, chunk);
    },
    flush(cb) {
      cb(seen === size ? null : changed(name));
    },
  });
}

/** Write the planned entries as one tar to `sink`; with `digest`, also the archive's sha256. */
export async function writeArchive(
  entries: PlannedEntry[],
  sink: NodeJS.WritableStream,
  opts: { digest?: boolean; signal?: AbortSignal | undefined } = {},
): Promise<ArchiveSummary> {
  const { signal } = opts;
  const pack = tar.pack();
  const archiveHash = opts.digest ? createHash('sha256') : undefined;
  let bytes = 0;
  const tap = new Transform({
    transform(chunk: Buffer, _enc, cb) {
      archiveHash?.update(chunk);
      bytes += chunk.length;
      cb(null, chunk);
    },
  });
  const written = pipeline(pack, tap, sink, { signal });
  const fill = async () => {
    for (const entry of entries) {
      const header = { ...FIXED_HEADER, name: entry.type === 'directory' ? `${entry.name}/` : entry.name, mode: entry.mode };
      if (entry.type === 'directory') {
        pack.entry({ ...header, type: 'directory' });
      } else if ('content' in entry) {
        const content = Buffer.from(entry.content, 'utf8');
        if (content.length !== entry.size || createHash('sha256').update(content).digest('hex') !== entry.sha256) throw changed(entry.name);
        await new Promise<void>((resolve, reject) => pack.entry({ ...header, type: 'file', size: entry.size }, content, (err) => (err ? reject(err) : resolve())));
      } else {
        if ((await fileIdentity(entry.source)) !== entry.identity) throw changed(entry.name);
        const source = createReadStream(entry.source, { highWaterMark: READ_CHUNK_BYTES });
        await pipeline(source, sized(entry.name, entry.size), pack.entry({ ...header, type: 'file', size: entry.size }), { signal });
        if ((await fileIdentity(entry.source)) !== entry.identity) throw changed(entry.name);
      }
    }
    pack.finalize();
  };
  try {
    await Promise.all([fill(), written]);
  } catch (err) {
    pack.destroy(err as Error);
    throw err;
  }
  return { bytes, sha256: archiveHash?.digest('hex') };
}
