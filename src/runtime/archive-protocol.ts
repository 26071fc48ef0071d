// What the main thread asks the runtime builder thread to do, and its answers. The thread only
// executes plans (read, hash, pack); every decision (manifest, order, modes, id) is made in TypeScript
// on the main thread. Each request carries its own MessagePort, so one thread serves any number.
import type { MessagePort } from 'node:worker_threads';

/** Archive bytes the builder may send ahead of what the main thread has consumed. */
export const ARCHIVE_WINDOW_BYTES = 8 * 1024 * 1024;

/** Where a file's bytes come from: a host file (symlinks followed) or inline UTF-8 text. */
export type FileSource = { source: string } | { content: string };

export interface FileDigest {
  size: number;
  /** Hex sha256 of the content. */
  sha256: string;
}

/** One entry of the archive, in order; a file's bytes must match its size and sha256. */
export type PlannedEntry =
  | { type: 'directory'; name: string; mode: number }
  | ({ type: 'file'; name: string; mode: number } & FileDigest & FileSource);

export interface ArchiveSummary {
  /** Bytes of the archive. */
  bytes: number;
  /** Hex sha256 of the archive bytes. */
  sha256: string;
}

export type BuilderRequest =
  | { op: 'hash'; files: FileSource[]; port: MessagePort }
  | { op: 'archive'; entries: PlannedEntry[]; port: MessagePort };

export type BuilderReply =
  | { type: 'hashed'; digests: FileDigest[] }
  | { type: 'data'; chunk: Uint8Array }
  | { type: 'end'; summary: ArchiveSummary }
  | { type: 'error'; message: string };

/** What the main thread sends back on an archive's port as it consumes bytes. */
export interface ArchiveAck {
  type: 'ack';
  bytes: number;
}
