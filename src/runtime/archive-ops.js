// @ts-check
// The runtime builder's two operations, streaming with flat memory: hash files (one reused 1 MiB
// buffer, incremental sha256) and write a planned tar with tar-stream, checking each file against its
// planned size and sha256 as it streams. Plain JavaScript (type-checked through JSDoc) because it is
// loaded by a worker thread: a tsx loader there costs 0.3-0.7 s per thread start on these machines.
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { open } from 'node:fs/promises';
import { Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import tar from 'tar-stream';

/** @typedef {import('./archive-protocol.ts').FileSource} FileSource */
/** @typedef {import('./archive-protocol.ts').FileDigest} FileDigest */
/** @typedef {import('./archive-protocol.ts').PlannedEntry} PlannedEntry */
/** @typedef {import('./archive-protocol.ts').ArchiveSummary} ArchiveSummary */

const READ_CHUNK_BYTES = 1024 * 1024;

/** Root owns everything and every timestamp is the epoch: only names, modes and bytes reach the archive. */
const FIXED_HEADER = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' };

/** @param {FileSource} file */
const describe = (file) => ('source' in file ? file.source : '(inline content)');

/**
 * @param {FileSource} file
 * @param {Buffer} buf
 * @param {AbortSignal | undefined} signal
 * @returns {Promise<FileDigest>}
 */
async function hashOne(file, buf, signal) {
  if ('content' in file) {
    const bytes = Buffer.from(file.content, 'utf8');
    return { size: bytes.length, sha256: createHash('sha256').update(bytes).digest('hex') };
  }
  const hash = createHash('sha256');
  let size = 0;
  try {
    const fh = await open(file.source, 'r');
    try {
      for (;;) {
        signal?.throwIfAborted();
        const { bytesRead } = await fh.read(buf, 0, buf.length, null);
        if (bytesRead === 0) break;
        hash.update(buf.subarray(0, bytesRead));
        size += bytesRead;
      }
    } finally {
      await fh.close();
    }
  } catch (err) {
    if (signal?.aborted) throw err;
    throw new Error(`cannot read ${describe(file)}: ${/** @type {Error} */ (err).message}`, { cause: err });
  }
  return { size, sha256: hash.digest('hex') };
}

/**
 * Size and sha256 of each file, in order.
 * @param {FileSource[]} files
 * @param {AbortSignal} [signal]
 * @returns {Promise<FileDigest[]>}
 */
export async function hashFiles(files, signal) {
  const buf = Buffer.allocUnsafe(READ_CHUNK_BYTES);
  const digests = [];
  for (const file of files) digests.push(await hashOne(file, buf, signal));
  return digests;
}

/**
 * @param {string} name
 * @returns {Error}
 */
const changed = (name) => new Error(`${name} changed since it was hashed; its generation would not match its id`);

/**
 * Passes a file's bytes through and fails if they are not the planned ones.
 * @param {{ name: string } & FileDigest} expected
 */
function verifying(expected) {
  const hash = createHash('sha256');
  let size = 0;
  return new Transform({
    transform(/** @type {Buffer} */ chunk, _enc, cb) {
      hash.update(chunk);
      size += chunk.length;
      if (size > expected.size) cb(changed(expected.name));
      else cb(null, chunk);
    },
    flush(cb) {
      cb(size === expected.size && hash.digest('hex') === expected.sha256 ? null : changed(expected.name));
    },
  });
}

/**
 * Write the planned entries as one tar to `sink`.
 * @param {PlannedEntry[]} entries
 * @param {NodeJS.WritableStream} sink
 * @param {AbortSignal} [signal]
 * @returns {Promise<ArchiveSummary>}
 */
export async function writeArchive(entries, sink, signal) {
  const pack = tar.pack();
  const archiveHash = createHash('sha256');
  let bytes = 0;
  const tap = new Transform({
    transform(/** @type {Buffer} */ chunk, _enc, cb) {
      archiveHash.update(chunk);
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
        await new Promise((resolve, reject) => pack.entry({ ...header, type: 'file', size: entry.size }, content, (err) => (err ? reject(err) : resolve(undefined))));
      } else {
        const source = createReadStream(entry.source, { highWaterMark: READ_CHUNK_BYTES });
        await pipeline(source, verifying(entry), pack.entry({ ...header, type: 'file', size: entry.size }), { signal });
      }
    }
    pack.finalize();
  };
  try {
    await Promise.all([fill(), written]);
  } catch (err) {
    pack.destroy(/** @type {Error} */ (err));
    throw err;
  }
  return { bytes, sha256: archiveHash.digest('hex') };
}
