// The checkpoint storage of an artifact store: objects (S3) through ObjectCheckpointStore, shared by
// every host; a folder (the data folder, or one every host mounts) through FolderCheckpointStore,
// both on the artifact store.
import type { Redis } from 'ioredis';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { FolderStore } from '../artifacts/folder-store.ts';
import type { CheckpointStorage } from './checkpoint-storage.ts';
import type { EpisodeLock } from './episode-lock.ts';
import { FolderCheckpointStore } from './folder-checkpoint-store.ts';
import { ObjectCheckpointStore } from './object-checkpoint-store.ts';

export function checkpointStorage(artifacts: ArtifactStore, redis: Redis, prefix: string, opts: { keep?: number; lock?: EpisodeLock }): CheckpointStorage {
  if (artifacts.kind === 's3') return new ObjectCheckpointStore(artifacts, redis, prefix, { ...(opts.keep !== undefined && { keep: opts.keep }) });
  return new FolderCheckpointStore(artifacts instanceof FolderStore ? artifacts : new FolderStore(artifacts.location), opts);
}
