// What the episode, the checkpoint writer and the results need of durable checkpoints, whichever
// store holds them: a folder (folder-checkpoint-store.ts, the default) or an object store shared by every
// host (object-checkpoint-store.ts). A retry on any host reads what any host's writer wrote.
import type { Readable } from 'node:stream';
import type { Checkpoint } from './checkpoint.ts';

export interface StoredWorkspaceTar {
  /** Where it is (a file path, or an object key), for logs. */
  path: string;
  bytes: number;
  /** A fresh stream of the tar (entries prefixed with the workdir's base name). */
  open(): Readable;
}

export interface StoredCheckpoint {
  seq: number;
  /** Its folder, or its objects' key prefix. */
  dir: string;
  checkpoint: Checkpoint;
  /** Absent when the checkpoint did not capture the workspace (`checkpoint.workspace.reason` says why). */
  workspaceTar?: StoredWorkspaceTar;
}

export interface CheckpointWriteResult {
  /** written: now durable; already-written: it was; superseded: `keep` newer ones were, nothing written. */
  outcome: 'written' | 'already-written' | 'superseded';
  /** The newest durable seq afterwards (-1: none yet). */
  latest: number;
  dir?: string;
}

export interface CheckpointStorage {
  /** Checkpoints kept per episode (the newest). */
  readonly keep: number;
  /** Persist one checkpoint (idempotent per seq); resolves once it is durable. */
  write(checkpoint: Checkpoint, workspaceTar?: Uint8Array): Promise<CheckpointWriteResult>;
  /** The newest durable checkpoint, or undefined. */
  latest(episodeId: string): Promise<StoredCheckpoint | undefined>;
  /** One checkpoint, or undefined when that seq is not (or no longer) kept. */
  read(episodeId: string, seq: number): Promise<StoredCheckpoint | undefined>;
  /** The durable seqs, ascending. */
  seqs(episodeId: string): Promise<number[]>;
  /** Remove every checkpoint of the episode. */
  remove(episodeId: string): Promise<void>;
}

/**
 * The checkpoint `pointer` names (latest.json, or the Redis pointer), or, without one or when its seq is
 * gone, the newest seq still readable: the writer died before publishing, or the pointed-at seq was
 * pruned between reading the pointer and reading it. Shared by both stores.
 */
export async function pointedOrNewest(storage: Pick<CheckpointStorage, 'read' | 'seqs'>, episodeId: string, pointer: number | undefined): Promise<StoredCheckpoint | undefined> {
  if (pointer !== undefined) {
    const found = await storage.read(episodeId, pointer);
    if (found) return found;
  }
  for (const seq of (await storage.seqs(episodeId)).reverse()) {
    const found = await storage.read(episodeId, seq);
    if (found) return found;
  }
  return undefined;
}
