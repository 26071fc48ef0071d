// A hostile archive cannot make evidence extraction write outside its folder or past its caps.
import { lstat, mkdtemp, readFile, readdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import { describe, expect, it } from 'vitest';
import { tarBuffer } from '../../src/archive/tar-buffer.ts';
import { extractSafely } from '../../src/evidence/safe-extract.ts';

async function archive(entries: { name: string; type?: 'file' | 'symlink' | 'link' | 'directory'; linkname?: string; body?: string | Buffer }[]): Promise<Readable> {
  const bytes = await tarBuffer((pack) => {
    for (const e of entries) {
      if (e.type === undefined || e.type === 'file') pack.entry({ name: e.name, type: 'file' }, e.body ?? '');
      else pack.entry({ name: e.name, type: e.type, linkname: e.linkname });
    }
  });
  return Readable.from([bytes]);
}

async function tree(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) {
    out.push(path.relative(dir, path.join(e.parentPath, e.name)));
  }
  return out.sort();
}

/**
 * first.txt, then a header that announces 16 GiB and zeros for as long as anyone reads (the end
 * of the archive never comes). `onChunk` sees the count of zero chunks served so far.
 */
async function endlessArchive(endlessName: string, onChunk: (served: number) => void = () => undefined) {
  const first = await tarBuffer((pack) => pack.entry({ name: 'first.txt' }, 'first'));
  const pack = tar.pack();
  pack.entry({ name: endlessName, size: 16 * 1024 ** 3 });
  const header = await new Promise<Buffer>((resolve) => pack.once('data', (b: unknown) => resolve(Buffer.from(b as Buffer))));
  const chunk = Buffer.alloc(64 * 1024);
  let served = 0;
  async function* stream() {
    yield first.subarray(0, first.length - 1024); // without the end-of-archive blocks
    yield header;
    for (;;) {
      served += 1;
      onChunk(served);
      yield chunk;
    }
  }
  return { archive: Readable.from(stream()), servedBytes: () => served * chunk.length, chunkBytes: chunk.length };
}

describe('extractSafely', () => {
  it('refuses traversal, absolute paths and links, and writes only inside its folder', async () => {
    const base = await mkdtemp(path.join(os.tmpdir(), 'rf-extract-'));
    const dest = path.join(base, 'evidence');
    const report = await extractSafely(await archive([
      { name: 'ws/', type: 'directory' },
      { name: 'ws/ok.txt', body: 'fine' },
      { name: 'ws/../../escape.txt', body: 'out' },
      { name: '/abs.txt', body: 'abs' },
      { name: 'ws/link', type: 'symlink', linkname: '/etc' },
      { name: 'ws/link/passwd', body: 'through the link' },
      { name: 'ws/up', type: 'symlink', linkname: '../..' },
      { name: 'ws/hard', type: 'link', linkname: 'ws/ok.txt' },
    ]), dest, { maxBytes: 1000, maxFileBytes: 1000, maxFiles: 10, strip: 1 });

    expect(await readFile(path.join(dest, 'ok.txt'), 'utf8')).toBe('fine');
    // ws/link/passwd becomes a real folder and file inside dest, never a write through a link.
    expect(await tree(base)).toEqual(['evidence', 'evidence/link', 'evidence/link/passwd', 'evidence/ok.txt']);
    expect((await lstat(path.join(dest, 'link'))).isDirectory()).toBe(true);
    expect(report.skipped.map((s) => s.reason)).toEqual([
      'unsafe path', 'unsafe path', 'symlink to "/etc" not followed', 'symlink to "../.." not followed', 'link to "ws/ok.txt" not followed',
    ]);
  });

  it('caps per-file and total bytes and the number of files', async () => {
    const dest = await mkdtemp(path.join(os.tmpdir(), 'rf-extract-'));
    const report = await extractSafely(await archive([
      { name: 'a', body: Buffer.alloc(100, 'a') },
      { name: 'b', body: Buffer.alloc(100, 'b') },
      { name: 'c', body: Buffer.alloc(100, 'c') },
    ]), dest, { maxBytes: 120, maxFileBytes: 60, maxFiles: 10 });
    expect(report.files).toEqual([{ path: 'a', size: 100, keptBytes: 60 }, { path: 'b', size: 100, keptBytes: 60 }]);
    expect(report.bytesWritten).toBe(120);
    expect(report.truncated).toBe(true);
    // A file kept in part is named too: its 60 bytes do not pass for the whole file.
    expect(report.skipped).toEqual([
      { path: 'a', reason: 'cut to its first 60 of 100 bytes' },
      { path: 'b', reason: 'cut to its first 60 of 100 bytes' },
      { path: 'c', reason: 'cap reached' },
    ]);
    expect((await readFile(path.join(dest, 'a'))).length).toBe(60);
  });

  it('stops reading an archive past maxReadBytes (a 16 GiB sparse file), keeping what came before and saying so', async () => {
    const dest = await mkdtemp(path.join(os.tmpdir(), 'rf-extract-'));
    const { archive, servedBytes } = await endlessArchive('sparse.bin');
    const report = await extractSafely(archive, dest, { maxBytes: 1000, maxFileBytes: 100, maxFiles: 10, maxReadBytes: 1024 * 1024 });
    expect(servedBytes()).toBeLessThan(2 * 1024 * 1024);
    expect(report.truncated).toBe(true);
    expect(report.files.map((f) => [f.path, f.keptBytes])).toEqual([['first.txt', 5], ['sparse.bin', 100]]);
    expect(report.skipped).toEqual([
      { path: 'sparse.bin', reason: expect.stringMatching(/^cut to its first 100 of at least \d+ bytes$/) as unknown as string },
      { path: '*', reason: 'the rest not read: the archive passed 1048576 bytes' },
    ]);
    expect(await readFile(path.join(dest, 'first.txt'), 'utf8')).toBe('first');
  });

  it('finds a file after one far bigger than the cap under the default read bound (a build output does not hide the fix)', async () => {
    const dest = await mkdtemp(path.join(os.tmpdir(), 'rf-extract-'));
    // 6x the total cap (12x the file cap): the file is cut to the file cap, read past, and the next one kept whole.
    const bytes = await tarBuffer((pack) => {
      pack.entry({ name: 'big.bin' }, Buffer.alloc(12 * 1024 * 1024));
      pack.entry({ name: 'state.txt' }, 'fixed\n');
    });
    const report = await extractSafely(Readable.from([bytes]), dest, { maxBytes: 2 * 1024 * 1024, maxFileBytes: 1024 * 1024, maxFiles: 10 });
    expect(report.files).toEqual([{ path: 'big.bin', size: 12 * 1024 * 1024, keptBytes: 1024 * 1024 }, { path: 'state.txt', size: 6, keptBytes: 6 }]);
    expect(report.skipped).toEqual([{ path: 'big.bin', reason: `cut to its first ${1024 * 1024} of ${12 * 1024 * 1024} bytes` }]);
    expect(await readFile(path.join(dest, 'state.txt'), 'utf8')).toBe('fixed\n');
  });

  it('stops reading when its stop signal aborts, keeping what it had and saying time ran out', async () => {
    const dest = await mkdtemp(path.join(os.tmpdir(), 'rf-extract-'));
    const stop = new AbortController();
    // The byte bound (32 MiB here) is far off: only the signal ends this read.
    const { archive, servedBytes, chunkBytes } = await endlessArchive('endless.bin', (served) => {
      if (served === 16) stop.abort();
    });
    const report = await extractSafely(archive, dest, { maxBytes: 1024 * 1024, maxFileBytes: 100, maxFiles: 10 }, stop.signal);
    expect(servedBytes()).toBeLessThan(64 * chunkBytes);
    expect(report.files.map((f) => [f.path, f.keptBytes])).toEqual([['first.txt', 5], ['endless.bin', 100]]);
    expect(report.skipped.at(-1)).toEqual({ path: '*', reason: expect.stringMatching(/^the rest not read: time ran out after \d+ bytes$/) as unknown as string });
    expect(report.truncated).toBe(true);
    expect(await readFile(path.join(dest, 'first.txt'), 'utf8')).toBe('first');
  });

  it('reads nothing past the headers when its stop signal has already aborted', async () => {
    const dest = await mkdtemp(path.join(os.tmpdir(), 'rf-extract-'));
    const report = await extractSafely(await archive([{ name: 'a.txt', body: 'a' }]), dest, { maxBytes: 1000, maxFileBytes: 100, maxFiles: 10 }, AbortSignal.abort());
    expect(report.files).toEqual([]);
    expect(report.skipped).toEqual([{ path: '*', reason: 'the rest not read: time ran out after 0 bytes' }]);
  });
});
