// Packs parts of a folder into a deterministic tar: the same content gives byte-identical archives on
// any machine (entries sorted, mtime 0, uid and gid 0, no user names, modes 0644/0755 for files by
// their executable bit, 0755 for folders, 0777 for links), so the archive's sha256 names the content.
// The bytes are the ones tar-stream's pack wrote for the same entries (ustar, a PAX header for a name
// or link target ustar cannot hold): digests recorded before this file existed stay valid
// (test/unit/pack-folder.test.ts compares both byte for byte).
//
// Fast on folders of many small files (a repository, a build context): folders are listed with
// readdir's file types, then sizes and modes come from one lstat per file, then each file is read with
// one open, one read (asking a byte more, to see growth) and a close, straight into 64 KiB blocks that
// are hashed as they fill; headers are written into the same blocks. The calls are synchronous, in
// slices that let the event loop run (SLICE_MS below says why). Before this, each file took four
// awaited calls one after another, a stream pipeline and an AbortSignal of its own: 20,000 one-byte
// files took 20 s, 33x `tar cf - | sha256sum`; now about 3x, on a loaded machine (bench/pack-folder.ts).
//
// Refused, before a byte of a file is read: anything neither a regular file, a folder nor a symlink
// (FIFO, socket, device), more entries than `maxEntries`, and an archive the sizes make larger than
// `maxBytes`. Refused while packing: a file whose size changed since it was measured.
import { createHash } from 'node:crypto';
import { closeSync, constants, lstatSync, openSync, readdirSync, readlinkSync, readSync, type Dirent, type Stats } from 'node:fs';
import path from 'node:path';

/** Entries one archive may hold unless the caller says otherwise. */
export const DEFAULT_MAX_ENTRIES = 100_000;

export interface PackFolderOptions {
  /** The archive's size may not pass this: checked from the sizes before reading, and as bytes are written. */
  maxBytes: number;
  /**
   * Files, folders and links the archive may hold; the walk stops as soon as there are more.
   * @default DEFAULT_MAX_ENTRIES
   */
  maxEntries?: number;
  /** Each piece of the archive, in order; a piece is never reused after it is handed over. */
  onChunk?: (chunk: Buffer) => void;
}

export interface PackedFolder {
  /** sha256 of the archive bytes, hex. */
  digest: string;
  /** Archive bytes. */
  size: number;
  /** Files, folders and links packed. */
  entries: number;
}

export type PackRefusalKind =
  /** A FIFO, socket or device: `path` names it. */
  | 'special_file'
  /** More entries than maxEntries: `count` is how many were found before the walk stopped. */
  | 'too_many_entries'
  /** The archive would pass maxBytes: `size` is at least what it needs. */
  | 'too_large'
  /** A file or folder changed (size, type, vanished) while it was packed: `path` names it. */
  | 'changed'
  /** A folder, file or link could not be read: `path` names it. */
  | 'unreadable';

/** Why a folder was not packed; callers turn it into their own error, with their own words for the parts. */
export class PackRefusal extends Error {
  constructor(
    readonly kind: PackRefusalKind,
    message: string,
    readonly details: { path?: string; count?: number; size?: number; limit?: number },
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'PackRefusal';
  }
}

interface Entry {
  /** Name in the archive, relative to the root, `/`-separated. */
  rel: string;
  type: 'file' | 'directory' | 'symlink';
  /** File size from lstat, 0 for the rest. */
  size: number;
  mode: number;
  linkname: string;
}

/**
 * The file system is read with synchronous calls in slices of this many milliseconds, the event loop
 * let run between slices. Measured on 20,000 one-byte files (2026-12-02, 2 loaded cores): lstat and
 * readFile through libuv's pool of 4 threads, 32 in flight, took 4-6x the time of the same calls made
 * synchronously, every call a hop to a thread and back; tar makes them one after another too. The
 * slices keep timers and sockets served while a big folder is packed (on a loaded machine a slice
 * can still stretch to a few hundred ms: bench/pack-folder.ts prints the longest wait); a single call
 * that hangs (a dead network mount) blocks the process, as it would hold a pool thread and the pack forever.
 */
const SLICE_MS = 10;
/** The archive is written into blocks this big, hashed and handed over as each fills. */
const BLOCK_BYTES = 64 * 1024;

const errnoOf = (err: unknown): string | undefined => (err as NodeJS.ErrnoException | undefined)?.code;
const byName = (a: Dirent, b: Dirent) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

/** Says when a slice's time is spent; `await slicer.pause()` only then (an await per entry is a microtask each). */
class Slicer {
  private sliceStart = performance.now();
  due(): boolean {
    return performance.now() - this.sliceStart >= SLICE_MS;
  }
  async pause(): Promise<void> {
    await new Promise<void>((resolve) => setImmediate(resolve));
    this.sliceStart = performance.now();
  }
}

function special(abs: string): PackRefusal {
  return new PackRefusal('special_file', `${abs}: not a regular file, folder or symlink (a FIFO, socket or device cannot be packed)`, { path: abs });
}

/** A failed call on `abs` as a refusal: vanished or replaced (changed), or not readable. */
function failedOn(abs: string, what: string, err: unknown): PackRefusal {
  const code = errnoOf(err);
  return code === 'ENOENT' || code === 'ENOTDIR' || code === 'EINVAL' || code === 'ELOOP'
    ? new PackRefusal('changed', `${abs}: vanished or changed while it was packed`, { path: abs }, { cause: err })
    : new PackRefusal('unreadable', `${abs}: cannot read the ${what}: ${(err as Error).message}`, { path: abs }, { cause: err });
}

/**
 * Every entry of `parts` (missing parts skipped), in the archive's order: parts as given, each folder
 * followed by its children sorted by name (UTF-16 order, as Array.prototype.sort), depth first. Stops
 * at the first entry past `maxEntries`, so a folder of millions is refused without listing it all.
 */
async function walk(root: string, parts: readonly string[], maxEntries: number, slicer: Slicer): Promise<Entry[]> {
  const out: Entry[] = [];
  const add = (rel: string, type: Entry['type']) => {
    if (out.length >= maxEntries) {
      throw new PackRefusal('too_many_entries', `${root}: more than ${maxEntries} entries (files, folders and links) to pack`, { count: out.length + 1, limit: maxEntries });
    }
    out.push({ rel, type, size: 0, mode: 0, linkname: '' });
  };
  const listFolder = async (rel: string): Promise<void> => {
    const abs = `${root}/${rel}`;
    let dirents: Dirent[];
    try {
      dirents = readdirSync(abs, { withFileTypes: true });
    } catch (err) {
      throw failedOn(abs, 'folder', err);
    }
    dirents.sort(byName);
    for (const d of dirents) {
      const childRel = `${rel}/${d.name}`;
      if (d.isSymbolicLink()) add(childRel, 'symlink');
      else if (d.isFile()) add(childRel, 'file');
      else if (d.isDirectory()) {
        add(childRel, 'directory');
        await listFolder(childRel);
      } else throw special(`${root}/${childRel}`);
    }
    if (slicer.due()) await slicer.pause();
  };

  for (const part of parts) {
    const rel = path.posix.normalize(part);
    const abs = path.join(root, rel);
    let st: Stats;
    try {
      st = lstatSync(abs);
    } catch (err) {
      // A part the folder does not have is simply not in the archive.
      if (errnoOf(err) === 'ENOENT' || errnoOf(err) === 'ENOTDIR') continue;
      throw failedOn(abs, 'file', err);
    }
    if (st.isSymbolicLink()) add(rel, 'symlink');
    else if (st.isFile()) add(rel, 'file');
    else if (st.isDirectory()) {
      add(rel, 'directory');
      await listFolder(rel);
    } else throw special(abs);
  }
  return out;
}

/** Sizes and modes of the files, targets of the links; no file is opened. */
async function measure(root: string, entries: readonly Entry[], slicer: Slicer): Promise<void> {
  for (const e of entries) {
    if (e.type === 'directory') continue;
    const abs = `${root}/${e.rel}`;
    try {
      if (e.type === 'symlink') {
        e.linkname = readlinkSync(abs);
        continue;
      }
      const st = lstatSync(abs);
      if (!st.isFile()) throw new PackRefusal('changed', `${abs}: changed from a file to something else while it was packed`, { path: abs });
      e.size = st.size;
      e.mode = st.mode;
    } catch (err) {
      throw err instanceof PackRefusal ? err : failedOn(abs, e.type === 'symlink' ? 'link' : 'file', err);
    }
    if (slicer.due()) await slicer.pause();
  }
}

/** The archive size the entries need at least: a 512-byte header each, data padded to 512, the end. */
function minimumArchiveBytes(entries: readonly Entry[]): number {
  let sum = 1024;
  for (const e of entries) sum += 512 + Math.ceil(e.size / 512) * 512;
  return sum;
}

// ---- tar headers, as tar-stream 3 encodes them ------------------------------------------------------

const TYPEFLAG = { file: 0, symlink: 2, directory: 5, pax: 72 } as const;

/** `value` in octal, zero-padded to `digits`, then a space (tar-stream's encodeOct). */
function writeOctal(buf: Buffer, offset: number, value: number, digits: number): void {
  const text = value.toString(8);
  if (text.length > digits) buf.write(`${'7'.repeat(digits)} `, offset, 'latin1');
  else buf.write(`${text.padStart(digits, '0')} `, offset, 'latin1');
}

/** ustar's name and prefix fields for `name`, or undefined when only a PAX header can hold it. */
function ustarName(name: string): { name: string; prefix: string } | undefined {
  // Not ASCII: tar-stream falls back to PAX for any name whose UTF-8 bytes differ from its characters.
  if (Buffer.byteLength(name) !== name.length) return undefined;
  let rest = name;
  let prefix = '';
  while (rest.length > 100) {
    const i = rest.indexOf('/');
    if (i === -1) return undefined;
    prefix += prefix ? `/${rest.slice(0, i)}` : rest.slice(0, i);
    rest = rest.slice(i + 1);
  }
  if (rest.length > 100 || prefix.length > 155) return undefined;
  return { name: rest, prefix };
}

/** The fields every header shares (uid, gid, mtime 0, ustar magic, device numbers), copied in first. */
const HEADER_TEMPLATE = (() => {
  const buf = Buffer.alloc(512);
  writeOctal(buf, 108, 0, 6);
  writeOctal(buf, 116, 0, 6);
  writeOctal(buf, 136, 0, 11);
  buf.write('ustar\u000000', 257, 'latin1');
  writeOctal(buf, 329, 0, 6);
  writeOctal(buf, 337, 0, 6);
  return buf;
})();

/** One 512-byte header at `buf[offset..]` (already zero). */
function writeHeader(buf: Buffer, offset: number, name: { name: string; prefix: string }, mode: number, size: number, typeflag: number, linkname: string): void {
  HEADER_TEMPLATE.copy(buf, offset);
  buf.write(name.name, offset, 'latin1');
  writeOctal(buf, offset + 100, mode & 0o7777, 6);
  if (size.toString(8).length > 11) {
    // Base-256 for sizes past 8 GiB.
    buf[offset + 124] = 0x80;
    let n = size;
    for (let i = 11; i > 0; i--) {
      buf[offset + 124 + i] = n & 0xff;
      n = Math.floor(n / 0x100);
    }
  } else writeOctal(buf, offset + 124, size, 11);
  buf[offset + 156] = 0x30 + typeflag;
  if (linkname) buf.write(linkname, offset + 157, 'utf8');
  if (name.prefix) buf.write(name.prefix, offset + 345, 'latin1');
  // The checksum counts its own 8 bytes as spaces.
  let sum = 8 * 32;
  for (let i = offset; i < offset + 148; i++) sum += buf[i]!;
  for (let i = offset + 156; i < offset + 512; i++) sum += buf[i]!;
  writeOctal(buf, offset + 148, sum, 6);
}

/** A PAX record `"<len> key=value\n"`, its length counting itself (tar-stream's addLength). */
function paxRecord(text: string): string {
  const len = Buffer.byteLength(text);
  let digits = Math.floor(Math.log(len) / Math.log(10)) + 1;
  if (len + digits >= Math.pow(10, digits)) digits++;
  return `${len + digits}${text}`;
}

// ---- the writer ---------------------------------------------------------------------------------------

/** Fills zeroed blocks with the archive, hashes and hands over each as it fills; counts bytes against the cap. */
class ArchiveWriter {
  private block = Buffer.alloc(BLOCK_BYTES);
  private used = 0;
  readonly hash = createHash('sha256');
  size = 0;

  constructor(
    private readonly root: string,
    private readonly maxBytes: number,
    private readonly onChunk: ((chunk: Buffer) => void) | undefined,
  ) {}

  private emit(chunk: Buffer): void {
    this.size += chunk.length;
    // Only a file that grew or PAX headers can get here past the cap measured before reading.
    if (this.size > this.maxBytes) {
      throw new PackRefusal('too_large', `${this.root}: the archive is larger than ${this.maxBytes} bytes (at least ${this.size} bytes)`, { size: this.size, limit: this.maxBytes });
    }
    this.hash.update(chunk);
    this.onChunk?.(chunk);
  }

  private flush(): void {
    if (this.used === 0) return;
    this.emit(this.block.subarray(0, this.used));
    this.block = Buffer.alloc(BLOCK_BYTES);
    this.used = 0;
  }

  /** Room for `bytes` zero bytes at the block's end; returns their offset. */
  private reserve(bytes: number): number {
    if (this.used + bytes > BLOCK_BYTES) this.flush();
    const at = this.used;
    this.used += bytes;
    return at;
  }

  /** Data then zeros up to the next 512 bytes. */
  data(bytes: Buffer): void {
    const padded = Math.ceil(bytes.length / 512) * 512;
    if (padded <= BLOCK_BYTES) {
      const at = this.reserve(padded); // first: it may start a new block
      bytes.copy(this.block, at);
      return;
    }
    this.flush();
    this.emit(bytes);
    if (padded > bytes.length) this.reserve(padded - bytes.length);
  }

  /**
   * The `size` bytes of the open file `fd`, then zeros up to the next 512 bytes. Small files are read
   * straight into the block; one byte more is asked for, so a file that grew is seen without another call.
   */
  file(fd: number, size: number): number {
    const padded = Math.ceil(size / 512) * 512;
    if (padded + 1 <= BLOCK_BYTES) {
      if (this.used + padded + 1 > BLOCK_BYTES) this.flush();
      // The block is zero past `used`: bytes read beyond `size` only happen when the file grew, and
      // then the archive is abandoned.
      const read = readFull(fd, this.block, this.used, size + 1);
      if (read === size) this.used += padded;
      return read;
    }
    // Big files go through as their own chunk, not copied.
    const bytes = Buffer.allocUnsafe(size + 1);
    const read = readFull(fd, bytes, 0, size + 1);
    if (read === size) this.data(bytes.subarray(0, size));
    return read;
  }

  private headerBlock(name: { name: string; prefix: string }, mode: number, size: number, typeflag: number, linkname: string): void {
    // Reserved first: reserving may hand over the full block and start a new one.
    const at = this.reserve(512);
    writeHeader(this.block, at, name, mode, size, typeflag, linkname);
  }

  header(fullName: string, mode: number, size: number, typeflag: number, linkname: string): void {
    const ustar = ustarName(fullName);
    if (ustar !== undefined && Buffer.byteLength(linkname) <= 100) {
      this.headerBlock(ustar, mode, size, typeflag, linkname);
      return;
    }
    const pax = Buffer.from(paxRecord(` path=${fullName}\n`) + (linkname ? paxRecord(` linkpath=${linkname}\n`) : ''));
    const paxName = { name: 'PaxHeader', prefix: '' };
    const paxLink = linkname ? 'PaxHeader' : '';
    this.headerBlock(paxName, mode, pax.length, TYPEFLAG.pax, paxLink);
    this.data(pax);
    this.headerBlock(paxName, mode, size, typeflag, paxLink);
  }

  end(): string {
    this.reserve(1024);
    this.flush();
    return this.hash.digest('hex');
  }
}

/** Reads up to `length` bytes into `buf[offset..]`, fewer only at the end of the file. */
function readFull(fd: number, buf: Buffer, offset: number, length: number): number {
  let total = 0;
  while (total < length) {
    const n = readSync(fd, buf, offset + total, length - total, null);
    if (n === 0) break;
    total += n;
  }
  return total;
}

/**
 * Not following a link that replaced the file since it was measured (ELOOP), and not waiting on a FIFO
 * that did (O_NONBLOCK: its open returns at once, its read gives no bytes, refused as a size change).
 */
const OPEN_FLAGS = constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK;

/** Pack `parts` of the folder `root` (absolute), handing each piece of the archive to `opts.onChunk`. */
export async function packFolder(root: string, parts: readonly string[], opts: PackFolderOptions): Promise<PackedFolder> {
  const maxEntries = opts.maxEntries ?? DEFAULT_MAX_ENTRIES;
  if (!Number.isInteger(opts.maxBytes) || opts.maxBytes < 1024) throw new TypeError(`maxBytes: expected an integer from 1024 up, got ${opts.maxBytes}`);
  if (!Number.isInteger(maxEntries) || maxEntries < 0) throw new TypeError(`maxEntries: expected an integer from 0 up, got ${maxEntries}`);

  if (!path.isAbsolute(root)) throw new TypeError(`root: expected an absolute path, got ${JSON.stringify(root)}`);
  // Names are joined to the root by hand: path.join on every entry was a tenth of the time.
  root = path.resolve(root).replace(/\/+$/, '') || '/';
  const slicer = new Slicer();
  const entries = await walk(root, parts, maxEntries, slicer);
  await measure(root, entries, slicer);
  const minimum = minimumArchiveBytes(entries);
  if (minimum > opts.maxBytes) {
    throw new PackRefusal('too_large', `${root}: the archive is larger than ${opts.maxBytes} bytes (at least ${minimum} bytes)`, { size: minimum, limit: opts.maxBytes });
  }

  const writer = new ArchiveWriter(root, opts.maxBytes, opts.onChunk);
  for (const e of entries) {
    if (e.type === 'directory') writer.header(`${e.rel}/`, 0o755, 0, TYPEFLAG.directory, '');
    else if (e.type === 'symlink') writer.header(e.rel, 0o777, 0, TYPEFLAG.symlink, e.linkname);
    else {
      const abs = `${root}/${e.rel}`;
      let fd: number;
      try {
        fd = openSync(abs, OPEN_FLAGS);
      } catch (err) {
        throw failedOn(abs, 'file', err);
      }
      try {
        writer.header(e.rel, (e.mode & 0o111) !== 0 ? 0o755 : 0o644, e.size, TYPEFLAG.file, '');
        let read: number;
        try {
          read = writer.file(fd, e.size);
        } catch (err) {
          throw failedOn(abs, 'file', err);
        }
        if (read !== e.size) {
          const how = read > e.size ? 'grew' : 'shrank';
          throw new PackRefusal('changed', `${abs}: ${how} while it was packed (${e.size} bytes measured, ${read > e.size ? 'more' : read} read)`, { path: abs });
        }
      } finally {
        closeSync(fd);
      }
    }
    if (slicer.due()) await slicer.pause();
  }
  const digest = writer.end();
  return { digest, size: writer.size, entries: entries.length };
}

/** packFolder, keeping the archive. */
export async function packFolderToBuffer(root: string, parts: readonly string[], opts: Omit<PackFolderOptions, 'onChunk'>): Promise<PackedFolder & { archive: Buffer }> {
  const chunks: Buffer[] = [];
  const packed = await packFolder(root, parts, { ...opts, onChunk: (chunk) => chunks.push(chunk) });
  return { ...packed, archive: Buffer.concat(chunks, packed.size) };
}
