// What the transcript page reads of an episode's evidence: per attempt, a few files by their known
// names, each up to its own cap (a trajectory is worth megabytes, a verifier's output much less), from
// the data folder or from the artifact store (FLEET_ARTIFACTS). As in evidence-files.ts: the episode
// id must be a plain id, only names found by listing are opened, symlinks are refused.
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { EPISODE_ID_PATTERN } from '../ids/episode-id.ts';
import { attemptFolders, readCapped } from './evidence-files.ts';

const ATTEMPT_DIR = /^attempt-(\d{1,6})$/;

/** The files the transcript shows, and how much of each is read at most. */
export const TRANSCRIPT_FILES = {
  'result.json': 256 * 1024,
  'trajectory.json': 8 * 1024 * 1024,
  /** Read only when an attempt has no trajectory.json (it did not close): the trajectory is built from it. */
  'model-calls.jsonl': 16 * 1024 * 1024,
  'agent.stdout.txt': 2 * 1024 * 1024,
  'agent.stderr.txt': 256 * 1024,
  'verifier.stdout.txt': 256 * 1024,
  'verifier.stderr.txt': 256 * 1024,
  'workspace.diff': 1024 * 1024,
  'evidence.json': 64 * 1024,
} as const;
export type TranscriptFileName = keyof typeof TRANSCRIPT_FILES;

export interface ReadFile {
  /** The first bytes of the file (up to its cap), as UTF-8. */
  text: string;
  sizeBytes: number;
  truncated: boolean;
}

export interface AttemptFiles {
  attempt: number;
  files: Partial<Record<TranscriptFileName, ReadFile>>;
}

const isTranscriptFile = (name: string): name is TranscriptFileName => Object.hasOwn(TRANSCRIPT_FILES, name);

/** The files of `names` that an attempt's listing holds, minus model-calls.jsonl when a trajectory is there. */
function wanted(names: readonly string[]): TranscriptFileName[] {
  const known = names.filter(isTranscriptFile);
  return known.includes('trajectory.json') ? known.filter((n) => n !== 'model-calls.jsonl') : known;
}

/** Every attempt of the episode in the data folder, in order, with the transcript's files. */
export async function readTranscriptFiles(dataDir: string, episodeId: string): Promise<AttemptFiles[]> {
  const attempts = await attemptFolders(dataDir, episodeId);
  return Promise.all(attempts.map(async ({ dir, attempt }) => {
    const names = (await readdir(dir, { withFileTypes: true }).catch(() => [])).filter((d) => d.isFile()).map((d) => d.name);
    const files: AttemptFiles['files'] = {};
    await Promise.all(wanted(names).map(async (name) => {
      const capBytes = TRANSCRIPT_FILES[name];
      const read = await readCapped(path.join(dir, name), capBytes);
      if (read !== undefined) files[name] = { ...read, truncated: read.sizeBytes > capBytes };
    }));
    return { attempt, files };
  }));
}

/** The same from the artifact store: one listing, then each wanted file read up to its cap. */
export async function readTranscriptFilesFromStore(store: ArtifactStore, episodeId: string, signal: AbortSignal): Promise<AttemptFiles[]> {
  if (!EPISODE_ID_PATTERN.test(episodeId)) return [];
  const base = `evidence/${episodeId}/`;
  const byAttempt = new Map<number, Map<string, { key: string; bytes: number }>>();
  for (const entry of await store.list(base, { signal })) {
    const [dir, name, ...deeper] = entry.key.slice(base.length).split('/');
    const m = ATTEMPT_DIR.exec(dir ?? '');
    if (m === null || name === undefined || deeper.length > 0) continue;
    const attempt = Number(m[1]);
    if (!byAttempt.has(attempt)) byAttempt.set(attempt, new Map());
    byAttempt.get(attempt)!.set(name, entry);
  }
  const out = await Promise.all([...byAttempt].map(async ([attempt, entries]): Promise<AttemptFiles> => {
    const files: AttemptFiles['files'] = {};
    await Promise.all(wanted([...entries.keys()]).map(async (name) => {
      const { key, bytes } = entries.get(name)!;
      const cap = TRANSCRIPT_FILES[name];
      const stream = await store.open(key, { signal });
      if (stream === undefined) return;
      const chunks: Buffer[] = [];
      let read = 0;
      try {
        for await (const chunk of stream) {
          const buf = chunk as Buffer;
          chunks.push(buf.subarray(0, cap - read));
          read += Math.min(buf.length, cap - read);
          if (read >= cap) break;
        }
      } finally {
        stream.destroy();
      }
      files[name] = { text: Buffer.concat(chunks).toString('utf8'), sizeBytes: bytes, truncated: bytes > cap };
    }));
    return { attempt, files };
  }));
  return out.sort((a, b) => a.attempt - b.attempt);
}
