// Reading an episode's evidence for the dashboard: FLEET_DATA_DIR/evidence/<episode>/attempt-<n>/*.
// Only names found by listing the folder are opened (never a name from the request), the episode id
// must be a plain id whose folder resolves inside the evidence root, symlinks are skipped, and each
// file is read up to a cap.
import { constants } from 'node:fs';
import { open, readdir } from 'node:fs/promises';
import path from 'node:path';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { EPISODE_ID_PATTERN } from '../ids/episode-id.ts';

const ATTEMPT_DIR = /^attempt-(\d{1,6})$/;

export interface EvidenceFile {
  attempt: number;
  name: string;
  sizeBytes: number;
  /** The first capBytes of the file, as UTF-8 (a cut multi-byte character shows as U+FFFD). */
  text: string;
  truncated: boolean;
}

/** The episode's evidence folder, or undefined when the id could point anywhere else. */
export function evidenceFolder(dataDir: string, episodeId: string): string | undefined {
  if (!EPISODE_ID_PATTERN.test(episodeId)) return undefined;
  const root = path.resolve(dataDir, 'evidence');
  const folder = path.resolve(root, episodeId);
  const rel = path.relative(root, folder);
  return rel === '' || rel.startsWith('..') || path.isAbsolute(rel) || rel.includes(path.sep) ? undefined : folder;
}

/** A regular file's first capBytes (never through a symlink), its size, or undefined. */
export async function readCapped(file: string, capBytes: number): Promise<{ sizeBytes: number; text: string } | undefined> {
  // O_NOFOLLOW: a symlink swapped in after the listing is refused, not followed.
  const fh = await open(file, constants.O_RDONLY | constants.O_NOFOLLOW).catch(() => undefined);
  if (fh === undefined) return undefined;
  try {
    const stat = await fh.stat();
    if (!stat.isFile()) return undefined;
    const buf = Buffer.alloc(Math.min(capBytes, stat.size));
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    return { sizeBytes: stat.size, text: buf.subarray(0, bytesRead).toString('utf8') };
  } finally {
    await fh.close();
  }
}

/** The episode's attempt-<n> folders in the data folder, in order (none for an id that could point elsewhere). */
export async function attemptFolders(dataDir: string, episodeId: string): Promise<{ dir: string; attempt: number }[]> {
  const folder = evidenceFolder(dataDir, episodeId);
  if (folder === undefined) return [];
  return (await readdir(folder, { withFileTypes: true }).catch(() => []))
    .flatMap((d) => {
      const m = ATTEMPT_DIR.exec(d.name);
      return d.isDirectory() && m ? [{ dir: path.join(folder, d.name), attempt: Number(m[1]) }] : [];
    })
    .sort((a, b) => a.attempt - b.attempt);
}

/** Every evidence file of every attempt, attempts in order, each read up to capBytes. */
export async function readEvidence(dataDir: string, episodeId: string, capBytes: number): Promise<EvidenceFile[]> {
  const attempts = await attemptFolders(dataDir, episodeId);
  const files: EvidenceFile[] = [];
  for (const { dir, attempt } of attempts) {
    const entries = (await readdir(dir, { withFileTypes: true }).catch(() => []))
      .filter((d) => d.isFile() && !d.name.startsWith('.'))
      .map((d) => d.name)
      .sort();
    for (const name of entries) {
      const read = await readCapped(path.join(dir, name), capBytes);
      if (read !== undefined) files.push({ attempt, name, ...read, truncated: read.sizeBytes > capBytes });
    }
  }
  return files;
}

/**
 * The same from the artifact store (FLEET_ARTIFACTS), so a dashboard on any host shows every host's
 * evidence: keys listed under evidence/<episode>/attempt-<n>/ (files of the attempt's top level), each
 * read up to capBytes from its stream.
 */
export async function readEvidenceFromStore(store: ArtifactStore, episodeId: string, capBytes: number, signal: AbortSignal): Promise<EvidenceFile[]> {
  if (!EPISODE_ID_PATTERN.test(episodeId)) return [];
  const base = `evidence/${episodeId}/`;
  const keys = await store.list(base, { signal });
  const files: EvidenceFile[] = [];
  for (const { key, bytes } of keys) {
    const [dir, name, ...deeper] = key.slice(base.length).split('/');
    const attempt = ATTEMPT_DIR.exec(dir ?? '');
    if (attempt === null || name === undefined || deeper.length > 0 || name.startsWith('.')) continue;
    const stream = await store.open(key, { signal });
    if (stream === undefined) continue;
    const chunks: Buffer[] = [];
    let read = 0;
    for await (const chunk of stream) {
      const buf = chunk as Buffer;
      chunks.push(buf.subarray(0, capBytes - read));
      read += Math.min(buf.length, capBytes - read);
      if (read >= capBytes) break;
    }
    stream.destroy();
    files.push({ attempt: Number(attempt[1]), name, sizeBytes: bytes, text: Buffer.concat(chunks).toString('utf8'), truncated: bytes > capBytes });
  }
  return files.sort((a, b) => a.attempt - b.attempt || a.name.localeCompare(b.name));
}
