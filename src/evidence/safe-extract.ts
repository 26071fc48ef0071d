// Extracts a tar that came out of a sandbox (getArchive) into an evidence folder, treating it as
// hostile: no absolute or `..` paths, no symlinks or hard links created or followed, files opened with
// O_NOFOLLOW | O_EXCL, and caps on file count, per-file size and total size, so a sandbox can neither
// write outside the folder nor fill the disk.
import { constants } from 'node:fs';
import { mkdir, open } from 'node:fs/promises';
import path from 'node:path';
import type { Readable } from 'node:stream';
import tar from 'tar-stream';

export interface ExtractLimits {
  /** Total bytes written. */
  maxBytes: number;
  /** Bytes written per file; the rest of a bigger file is dropped and the file marked truncated. */
  maxFileBytes: number;
  maxFiles: number;
  /** Drop this many leading path components (getArchive of /workspace names entries workspace/...). */
  strip?: number;
  /**
   * Bytes read from the archive, kept or not: past this the rest is not read (a sparse file of 16 GiB
   * would otherwise stream whole, at ~100 MB/s, through a close reserve). Files after a big one are
   * still found up to this bound: a 300 MB build output does not hide the file the diff is about.
   * @default 32 x maxBytes (512 MiB at the default 16 MiB), plus 1 KiB (headers) per file allowed
   */
  maxReadBytes?: number;
}

export interface ExtractedFile {
  path: string;
  size: number;
  keptBytes: number;
}

export interface ExtractReport {
  files: ExtractedFile[];
  /**
   * Entries not written whole, with the reason: unsafe path, link, special file, cap reached, cut to
   * its first bytes (a cut file is in `files` too), and the rest of the archive once it was not read.
   */
  skipped: { path: string; reason: string }[];
  bytesWritten: number;
  /** Some content was dropped because of a cap. */
  truncated: boolean;
}

const WRITE_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW;

/** The entry's path without its first `strip` components; undefined when unsafe or nothing is left. */
export function safeRelativePath(name: string, strip = 0): string | undefined {
  if (name.includes('\0') || name.startsWith('/')) return undefined;
  const parts = name.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.some((p) => p === '..')) return undefined;
  const kept = parts.slice(strip);
  return kept.length === 0 ? undefined : kept.join('/');
}

/**
 * `stop`, when it aborts, ends the read as the byte bound does: what was kept stays, the rest is said
 * not read (so a caller with a deadline still has time to use what it got).
 */
export async function extractSafely(archive: Readable, dest: string, limits: ExtractLimits, stop?: AbortSignal): Promise<ExtractReport> {
  const root = path.resolve(dest);
  await mkdir(root, { recursive: true });
  const report: ExtractReport = { files: [], skipped: [], bytesWritten: 0, truncated: false };
  const extract = tar.extract();
  archive.on('error', (err) => extract.destroy(err));
  const maxReadBytes = limits.maxReadBytes ?? limits.maxBytes * 32 + 1024 * (limits.maxFiles + 2);
  let read = 0;
  let stopped: string | undefined;
  const stopReading = (why: string) => {
    if (stopped !== undefined) return;
    stopped = why;
    extract.destroy(new Error(why));
    archive.destroy();
  };
  archive.on('data', (chunk: Buffer) => {
    read += chunk.length;
    if (read > maxReadBytes) stopReading(`the archive passed ${maxReadBytes} bytes`);
  });
  const onStop = () => stopReading(`time ran out after ${read} bytes`);
  if (stop?.aborted) onStop();
  else stop?.addEventListener('abort', onStop, { once: true });
  archive.pipe(extract);
  // The file being written when the read stops.
  let writing: ExtractedFile | undefined;
  const keep = (file: ExtractedFile) => {
    report.bytesWritten += file.keptBytes;
    report.files.push(file);
    if (file.keptBytes < file.size || stopped !== undefined) {
      report.truncated = true;
      report.skipped.push({ path: file.path, reason: `cut to its first ${file.keptBytes} of ${stopped !== undefined ? 'at least ' : ''}${file.size} bytes` });
    }
  };
  try {
    await extractEntries(extract, root, limits, report, (file) => (writing = file), keep);
  } catch (err) {
    if (stopped === undefined) throw err;
    if (writing !== undefined) keep(writing);
    report.truncated = true;
    report.skipped.push({ path: '*', reason: `the rest not read: ${stopped}` });
  } finally {
    stop?.removeEventListener('abort', onStop);
  }
  return report;
}

async function extractEntries(
  extract: tar.Extract,
  root: string,
  limits: ExtractLimits,
  report: ExtractReport,
  onWriting: (file: ExtractedFile | undefined) => void,
  keep: (file: ExtractedFile) => void,
): Promise<void> {
  for await (const entry of extract) {
    const { header } = entry;
    let shown = header.name;
    const skip = (reason: string) => {
      report.skipped.push({ path: shown, reason });
      entry.resume();
    };
    const full = safeRelativePath(header.name);
    if (full === undefined) {
      skip('unsafe path');
      continue;
    }
    const rel = safeRelativePath(full, limits.strip ?? 0);
    if (rel === undefined) {
      entry.resume(); // a folder that strip removes (the archive's top folder)
      continue;
    }
    shown = rel;
    const target = path.join(root, rel);
    if (header.type === 'directory') {
      await mkdir(target, { recursive: true }).catch(() => undefined);
      entry.resume();
      continue;
    }
    if (header.type === 'symlink' || header.type === 'link') {
      skip(`${header.type} to ${JSON.stringify(header.linkname ?? '')} not followed`);
      continue;
    }
    if (header.type !== 'file' && header.type !== 'contiguous-file') {
      skip(`${header.type ?? 'unknown'} entry`);
      continue;
    }
    const room = Math.min(limits.maxFileBytes, limits.maxBytes - report.bytesWritten);
    if (report.files.length >= limits.maxFiles || room <= 0) {
      report.truncated = true;
      skip('cap reached');
      continue;
    }
    if (!(await mkdir(path.dirname(target), { recursive: true }).then(() => true, () => false))) {
      skip('not written (its parent is not a folder)');
      continue;
    }
    const fh = await open(target, WRITE_FLAGS, 0o644).catch((err: NodeJS.ErrnoException) => err);
    if (!('write' in fh)) {
      skip(`not written (${fh.code ?? fh.message})`);
      continue;
    }
    const file: ExtractedFile = { path: rel, size: 0, keptBytes: 0 };
    onWriting(file);
    try {
      for await (const chunk of entry as AsyncIterable<Buffer>) {
        file.size += chunk.length;
        const take = Math.min(chunk.length, room - file.keptBytes);
        if (take > 0) {
          await fh.write(chunk.subarray(0, take));
          file.keptBytes += take;
        }
      }
    } finally {
      await fh.close();
    }
    onWriting(undefined);
    keep(file);
  }
}
