// A hostile archive cannot make evidence extraction write outside its folder or past its caps.
import { lstat, mkdtemp, readFile, readdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
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
    expect(report.skipped).toEqual([{ path: 'c', reason: 'cap reached' }]);
    expect((await readFile(path.join(dest, 'a'))).length).toBe(60);
  });
});
