// Reading an episode's evidence for the transcript, from the data folder and from an artifact store:
// known names only, each up to its cap, model-calls.jsonl only without a trajectory, no symlink
// followed, no id that leaves the evidence folder.
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FolderStore } from '../../src/artifacts/folder-store.ts';
import { TRANSCRIPT_FILES, readTranscriptFiles, readTranscriptFilesFromStore, type AttemptFiles } from '../../src/dashboard/transcript-evidence.ts';

describe('transcript evidence', () => {
  let dir: string;
  const episode = 'b.t.0';
  const summary = (attempts: AttemptFiles[]) => attempts.map((a) => ({
    attempt: a.attempt,
    files: Object.fromEntries(Object.entries(a.files).map(([name, f]) => [name, [f.text.length, f.sizeBytes, f.truncated]])),
  }));

  beforeAll(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'rf-transcript-'));
    const ev = path.join(dir, 'evidence', episode);
    await mkdir(path.join(ev, 'attempt-1', 'workspace'), { recursive: true });
    await mkdir(path.join(ev, 'attempt-2'), { recursive: true });
    await mkdir(path.join(ev, 'salvaged-abc'), { recursive: true });
    await writeFile(path.join(dir, 'secret.txt'), 'root:x:0:0');
    await writeFile(path.join(ev, 'attempt-1', 'trajectory.json'), '{}');
    await writeFile(path.join(ev, 'attempt-1', 'model-calls.jsonl'), 'not read: there is a trajectory');
    await writeFile(path.join(ev, 'attempt-1', 'verifier.stdout.txt'), 'v'.repeat(TRANSCRIPT_FILES['verifier.stdout.txt'] + 10));
    await writeFile(path.join(ev, 'attempt-1', 'other.txt'), 'not a transcript file');
    await writeFile(path.join(ev, 'attempt-1', 'workspace', 'result.json'), 'deeper: not read');
    await symlink(path.join(dir, 'secret.txt'), path.join(ev, 'attempt-1', 'agent.stdout.txt'));
    await writeFile(path.join(ev, 'attempt-2', 'model-calls.jsonl'), 'read: no trajectory');
    await writeFile(path.join(ev, 'salvaged-abc', 'result.json'), '{}');
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('reads the known files of every attempt from the data folder, capped, no symlink', async () => {
    const cap = TRANSCRIPT_FILES['verifier.stdout.txt'];
    expect(summary(await readTranscriptFiles(dir, episode))).toEqual([
      { attempt: 1, files: { 'trajectory.json': [2, 2, false], 'verifier.stdout.txt': [cap, cap + 10, true] } },
      { attempt: 2, files: { 'model-calls.jsonl': [19, 19, false] } },
    ]);
    expect(await readTranscriptFiles(dir, '..')).toEqual([]);
    expect(await readTranscriptFiles(dir, 'nothing.here')).toEqual([]);
  });

  it('reads the same from an artifact store', async () => {
    const cap = TRANSCRIPT_FILES['verifier.stdout.txt'];
    const store = new FolderStore(dir);
    const signal = AbortSignal.timeout(10_000);
    const files = summary(await readTranscriptFilesFromStore(store, episode, signal));
    expect(files).toEqual([
      { attempt: 1, files: { 'trajectory.json': [2, 2, false], 'verifier.stdout.txt': [cap, cap + 10, true] } },
      { attempt: 2, files: { 'model-calls.jsonl': [19, 19, false] } },
    ]);
    expect(await readTranscriptFilesFromStore(store, '../x', signal)).toEqual([]);
  });
});
