// A packed task, read back on the worker: its parts are re-packed into tars that putArchive writes
// into the sandbox (workspace/ at set-up, tests/ only for verification, solution/ for the oracle).
import { createHash } from 'node:crypto';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { collectBytes, tarBuffer, tarFolderName } from '../archive/tar-buffer.ts';
import { FleetError } from '../errors/fleet-error.ts';

interface ArchiveEntry {
  header: tar.Header;
  data: Buffer;
}

export interface Owner {
  uid: number;
  gid: number;
}

export class TaskArchive {
  private constructor(
    readonly digest: string,
    private readonly entries: readonly ArchiveEntry[],
  ) {}

  /** Parse an archive and check it against the digest the job carries. */
  static async fromBuffer(archive: Buffer, expectedDigest: string): Promise<TaskArchive> {
    const digest = createHash('sha256').update(archive).digest('hex');
    if (digest !== expectedDigest) {
      throw new FleetError('task_archive_missing', `task archive has digest ${digest}, the job names ${expectedDigest}`);
    }
    const entries: ArchiveEntry[] = [];
    const extract = tar.extract();
    for await (const entry of Readable.from([archive]).pipe(extract)) {
      entries.push({ header: entry.header, data: await collectBytes(entry) });
    }
    return new TaskArchive(digest, entries);
  }

  /** The names of every entry, in the archive's order. */
  names(): string[] {
    return this.entries.map((e) => e.header.name);
  }

  /** True when the archive has a folder `part/` (e.g. solution). */
  has(part: string): boolean {
    return this.entries.some((e) => e.header.name.startsWith(`${part}/`));
  }

  /** Text of one file of the archive, or undefined. */
  readText(name: string): string | undefined {
    return this.entries.find((e) => e.header.name === name && e.header.type === 'file')?.data.toString('utf8');
  }

  /** The regular files under `part/`, by path relative to it. */
  files(part: string): Map<string, Buffer> {
    const out = new Map<string, Buffer>();
    for (const { header, data } of this.entries) {
      if (header.type === 'file' && header.name.startsWith(`${part}/`)) out.set(header.name.slice(part.length + 1), data);
    }
    return out;
  }

  /**
   * The folder `part/` as a build context: a tar whose names are relative to the folder, modes as
   * packed, fixed owner and times, in the archive's (sorted) order. The same folder gives the same
   * bytes, so its sha256 names the content of an environment wherever it is packed.
   */
  async partAsContext(part: string): Promise<Buffer> {
    const common = { mtime: new Date(0), uid: 0, gid: 0, uname: '', gname: '' };
    return tarBuffer((pack) => {
      for (const { header, data } of this.entries) {
        if (!header.name.startsWith(`${part}/`)) continue;
        const name = header.name.slice(part.length + 1).replace(/\/$/, '');
        if (name === '') continue;
        if (header.type === 'directory') pack.entry({ ...common, name: `${name}/`, type: 'directory', mode: header.mode ?? 0o755 });
        else if (header.type === 'symlink') pack.entry({ ...common, name, type: 'symlink', linkname: header.linkname ?? '', mode: 0o777 });
        else pack.entry({ ...common, name, type: 'file', mode: header.mode ?? 0o644 }, data);
      }
    });
  }

  /**
   * A tar of the folder `part/` rebased to the absolute folder `dest`, for putArchive at "/": entry
   * names are relative to "/", owned by `owner`, with the destination folder itself as first entry;
   * after `folders` (empty folders, each with its owner, mode 0755), when given. The files named in
   * `executable` (relative to `part/`) get every x bit.
   */
  async partAsTar(part: string, dest: string, owner: Owner, folders: readonly { path: string; owner: Owner }[] = [], executable: readonly string[] = []): Promise<Buffer> {
    const base = tarFolderName(dest).slice(0, -1);
    const common = { mtime: new Date(0), uid: owner.uid, gid: owner.gid, uname: '', gname: '' };
    return tarBuffer((pack) => {
      for (const folder of folders) {
        pack.entry({ ...common, uid: folder.owner.uid, gid: folder.owner.gid, name: tarFolderName(folder.path), type: 'directory', mode: 0o755 });
      }
      pack.entry({ ...common, name: `${base}/`, type: 'directory', mode: 0o755 });
      for (const { header, data } of this.entries) {
        if (!header.name.startsWith(`${part}/`)) continue;
        const rel = header.name.slice(part.length + 1).replace(/\/$/, '');
        if (rel === '') continue;
        const name = path.posix.join(base, rel);
        if (header.type === 'directory') pack.entry({ ...common, name: `${name}/`, type: 'directory', mode: header.mode ?? 0o755 });
        else if (header.type === 'symlink') pack.entry({ ...common, name, type: 'symlink', linkname: header.linkname ?? '', mode: 0o777 });
        // As `chmod +x` would make them once copied in, without an exec for it.
        else pack.entry({ ...common, name, type: 'file', mode: (header.mode ?? 0o644) | (executable.includes(rel) ? 0o111 : 0) }, data);
      }
    });
  }
}
