// The artifact store as a folder: key `a/b/c.json` is the file <root>/a/b/c.json. Writes go through
// writeFileAtomic (temp name, fsync, rename, fsync of the folder), so a reader sees the old file or the
// new one, whole, and the new one survives a crash once put resolves. The temp files it leaves while
// writing (`.<name>.<hex>.tmp`) start with a dot, which no key segment may, so list never shows them.
// A key never reaches outside the root: checkKey refuses `..` and absolute paths, the resolved path is
// checked, and so is the real path of what is there (a symbolic link inside the root to elsewhere).
// File calls take no signal: each call is raced against its signal and rejects with the signal's
// reason as soon as it aborts (the work may finish in the background; a put is whole either way).
import { lstat, open, readdir, realpath, rm, rmdir, stat } from 'node:fs/promises';
import path from 'node:path';
import { addAbortSignal, type Readable } from 'node:stream';
import { untilAborted } from '../deadlines/deadline.ts';
import { fsyncDir, writeFileAtomic } from '../files/atomic-write.ts';
import { ArtifactStoreError, checkObjectKey, checkPrefix } from './artifacts-location.ts';
import { checkKey, type ArtifactStore } from './artifact-store.ts';

const isMissing = (err: unknown) => ['ENOENT', 'ENOTDIR'].includes((err as NodeJS.ErrnoException).code ?? '');

export class FolderStore implements ArtifactStore {
  readonly kind = 'folder' as const;
  readonly location: string;
  private realRoot: Promise<string> | undefined;

  constructor(readonly root: string) {
    if (!path.isAbsolute(root)) throw new TypeError(`Expected an absolute folder for the artifact store, got ${JSON.stringify(root)}`);
    this.root = path.resolve(root);
    this.location = this.root;
  }

  async put(key: string, body: Uint8Array | string, opts: { signal: AbortSignal; contentType?: string }): Promise<void> {
    checkObjectKey(key);
    await this.call('put', key, opts.signal, async () => {
      const file = this.fileOf(key);
      await this.checkReal(path.dirname(file), key);
      await writeFileAtomic(file, body);
    });
  }

  async get(key: string, opts: { signal: AbortSignal; maxBytes?: number }): Promise<Uint8Array | undefined> {
    checkObjectKey(key);
    return this.call('get', key, opts.signal, async () => {
      const file = this.fileOf(key);
      const fh = await open(file, 'r').catch((err: unknown) => (isMissing(err) || (err as NodeJS.ErrnoException).code === 'EISDIR' ? undefined : Promise.reject(err)));
      if (fh === undefined) return undefined;
      try {
        const st = await fh.stat();
        if (!st.isFile()) return undefined;
        await this.checkReal(file, key);
        if (opts.maxBytes !== undefined && st.size > opts.maxBytes) throw tooBig(this.location, key, st.size, opts.maxBytes);
        const data = await fh.readFile();
        // The file may have been replaced (renamed over) since the stat: the bytes read are what counts.
        if (opts.maxBytes !== undefined && data.length > opts.maxBytes) throw tooBig(this.location, key, data.length, opts.maxBytes);
        return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
      } finally {
        await fh.close();
      }
    });
  }

  async open(key: string, opts: { signal: AbortSignal }): Promise<Readable | undefined> {
    checkObjectKey(key);
    const stream = await this.call('open', key, opts.signal, async () => {
      const file = this.fileOf(key);
      const fh = await open(file, 'r').catch((err: unknown) => (isMissing(err) ? undefined : Promise.reject(err)));
      if (fh === undefined) return undefined;
      try {
        if (!(await fh.stat()).isFile()) {
          await fh.close();
          return undefined;
        }
        await this.checkReal(file, key);
      } catch (err) {
        await fh.close();
        throw err;
      }
      return fh.createReadStream();
    }, (late) => late?.destroy());
    // Past open, the stream itself stops (with an AbortError) when the signal aborts.
    return stream === undefined ? undefined : addAbortSignal(opts.signal, stream);
  }

  async list(prefix: string, opts: { signal: AbortSignal }): Promise<{ key: string; bytes: number }[]> {
    checkPrefix(prefix);
    return this.call('list', prefix, opts.signal, async () => {
      // Like S3, a plain string prefix: `a/b` lists `a/b`, `a/b/c` and `a/bc`. Walk the folder it ends in.
      const folder = prefix.includes('/') ? prefix.slice(0, prefix.lastIndexOf('/')) : '';
      const dir = folder === '' ? this.root : this.fileOf(folder);
      await this.checkReal(dir, prefix);
      const found: { key: string; bytes: number }[] = [];
      await this.walk(dir, folder, prefix, found, opts.signal);
      return found.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    });
  }

  async deletePrefix(prefix: string, opts: { signal: AbortSignal }): Promise<void> {
    checkKey(prefix);
    await this.call('deletePrefix', prefix, opts.signal, async () => {
      const target = this.fileOf(prefix.replace(/\/$/, ''));
      let st;
      try {
        await this.checkReal(target, prefix);
        st = await lstat(target);
      } catch (err) {
        if (isMissing(err)) return;
        throw err;
      }
      // A key removes that file only (a folder of that name is no object); a `.../` folder, every file in it.
      if (prefix.endsWith('/') !== st.isDirectory()) return;
      await rm(target, { recursive: true, force: true });
      await this.pruneEmptyParents(path.dirname(target));
    });
  }

  private fileOf(key: string): string {
    const file = path.resolve(this.root, ...key.split('/'));
    if (file !== this.root && !file.startsWith(this.root + path.sep)) {
      throw new TypeError(`Expected an artifact key inside ${this.root}, got ${JSON.stringify(key)}`);
    }
    return file;
  }

  /** The real path of `p` (or of its nearest existing folder) is inside the root's real path. */
  private async checkReal(p: string, key: string): Promise<void> {
    this.realRoot ??= realpath(this.root).catch((err: unknown) => {
      this.realRoot = undefined;
      throw err;
    });
    let realRoot: string;
    try {
      realRoot = await this.realRoot;
    } catch (err) {
      if (isMissing(err)) {
        // No root yet: nothing there can lead outside it. A read then finds nothing; a put creates it.
        return;
      }
      throw err;
    }
    let cur = p;
    for (;;) {
      let real: string;
      try {
        real = await realpath(cur);
      } catch (err) {
        if (!isMissing(err)) throw err;
        // Nothing there yet: the nearest folder that exists decides.
        if (cur === this.root || path.dirname(cur) === cur) return;
        cur = path.dirname(cur);
        continue;
      }
      if (real !== realRoot && !real.startsWith(realRoot + path.sep)) {
        throw new TypeError(`Expected an artifact key inside ${this.root}, got ${JSON.stringify(key)} (it leads to ${real})`);
      }
      return;
    }
  }

  private async walk(dir: string, rel: string, prefix: string, found: { key: string; bytes: number }[], signal: AbortSignal): Promise<void> {
    signal.throwIfAborted();
    let entries;
    try {
      entries = await readdir(dir, { withFileTypes: true });
    } catch (err) {
      if (isMissing(err)) return;
      throw err;
    }
    for (const entry of entries) {
      // Temp files of writeFileAtomic and anything else no key can name.
      if (entry.name.startsWith('.')) continue;
      const key = rel === '' ? entry.name : `${rel}/${entry.name}`;
      if (entry.isDirectory()) {
        // Descend only where keys under the prefix may be.
        if (`${key}/`.startsWith(prefix) || prefix.startsWith(`${key}/`)) await this.walk(path.join(dir, entry.name), key, prefix, found, signal);
      } else if (entry.isFile() && key.startsWith(prefix)) {
        const st = await stat(path.join(dir, entry.name)).catch((err: unknown) => (isMissing(err) ? undefined : Promise.reject(err)));
        if (st !== undefined) found.push({ key, bytes: st.size });
      }
    }
  }

  /** Remove the folders emptied by a delete, up to the root (a folder another call fills meanwhile stays). */
  private async pruneEmptyParents(dir: string): Promise<void> {
    let cur = dir;
    while (cur !== this.root && cur.startsWith(this.root + path.sep)) {
      try {
        await rmdir(cur);
      } catch {
        break;
      }
      cur = path.dirname(cur);
    }
    await fsyncDir(cur).catch(() => undefined);
  }

  /** Runs `work` against the signal; an error that is not the signal's is wrapped naming the operation and key. */
  private async call<T>(operation: string, key: string, signal: AbortSignal, work: () => Promise<T>, onLate?: (value: T) => void): Promise<T> {
    signal.throwIfAborted();
    try {
      return await untilAborted(work(), signal, onLate);
    } catch (err) {
      if (signal.aborted) throw signal.reason;
      if (err instanceof TypeError || err instanceof ArtifactStoreError) throw err;
      const e = err as NodeJS.ErrnoException;
      throw new ArtifactStoreError(operation, key, this.location, `${e.code ?? e.name}: ${e.message}`, { cause: err });
    }
  }
}

function tooBig(location: string, key: string, size: number, maxBytes: number): ArtifactStoreError {
  return new ArtifactStoreError('get', key, location, `the object is ${size} bytes, more than the ${maxBytes} allowed`);
}
