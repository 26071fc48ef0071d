// Where what outlives an episode's host is kept: checkpoints, evidence, trajectories. One small
// interface, two implementations: a folder (the default; one host, or a folder every host mounts) and
// an S3-compatible object store (FLEET_ARTIFACTS=s3://bucket/prefix). Keys are `/`-separated relative
// paths (`checkpoints/<episode>/<seq>/checkpoint.json`, `evidence/<episode>/attempt-1/agent.stdout.txt`).
// Every call takes a signal and fails with it: a store that is down or slow never holds a phase past
// its deadline. A leaf: the episode, the checkpoint writer, the dashboard and the CLI depend on this.
import type { Readable } from 'node:stream';

export interface ArtifactStore {
  /** `folder` or `s3`, and where (a path, or s3://bucket/prefix), for logs and the README's words. */
  readonly kind: 'folder' | 's3';
  readonly location: string;
  /** Store `body` at `key`, replacing what was there; a reader sees the old object or the new one, whole. */
  put(key: string, body: Uint8Array | string, opts: { signal: AbortSignal; contentType?: string }): Promise<void>;
  /** The object's bytes, or undefined when there is none. */
  get(key: string, opts: { signal: AbortSignal; maxBytes?: number }): Promise<Uint8Array | undefined>;
  /** The object as a stream (for big ones: workspace tars, evidence files), or undefined when there is none. */
  open(key: string, opts: { signal: AbortSignal }): Promise<Readable | undefined>;
  /** Keys under `prefix` (recursive), with their sizes, sorted by key. */
  list(prefix: string, opts: { signal: AbortSignal }): Promise<{ key: string; bytes: number }[]>;
  /** Remove every object under `prefix` (a key or a `.../` folder). Nothing there is not an error. */
  deletePrefix(prefix: string, opts: { signal: AbortSignal }): Promise<void>;
}

/** A key is relative, `/`-separated, of safe characters, never `.` or `..` segments. */
const SAFE_KEY = /^[A-Za-z0-9_+=@,-][A-Za-z0-9._+=@,-]*(\/[A-Za-z0-9_+=@,-][A-Za-z0-9._+=@,-]*)*\/?$/;

/** Throws a TypeError naming the key when it is not a safe relative key. */
export function checkKey(key: string): string {
  if (typeof key !== 'string' || key.length === 0 || key.length > 1024 || !SAFE_KEY.test(key) || key.split('/').some((s) => s === '..' || s === '.')) {
    throw new TypeError(`Expected an artifact key (a relative path of letters, digits and . _ + = @ , -), got ${JSON.stringify(key)}`);
  }
  return key;
}
