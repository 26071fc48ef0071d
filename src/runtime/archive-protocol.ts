// What the main thread asks the runtime builder thread to do, and its answers. The thread only
// executes plans (read, hash, pack); every decision (manifest, order, modes, id) is made in TypeScript
// on the main thread. Each request carries its own MessagePort, so one thread serves any number.
import type { MessagePort } from 'node:worker_threads';
import type { UploadTarget } from '../sandbox/archive-upload.ts';

/** Archive bytes the builder may send ahead of what the main thread's consumer took. */
export const ARCHIVE_WINDOW_BYTES = 16 * 1024 * 1024;

/** Where a file's bytes come from: a host file (symlinks followed) or inline UTF-8 text. */
export type FileSource = { source: string } | { content: string };

export interface FileDigest {
  size: number;
  /** Hex sha256 of the content. */
  sha256: string;
  /** Host files: stat identity when hashed; the archive step checks the file still has it. */
  identity?: string;
}

/** One entry of the archive, in order; a file's bytes must match its size and sha256. */
export type PlannedEntry =
  | { type: 'directory'; name: string; mode: number }
  | ({ type: 'file'; name: string; mode: number } & FileDigest & FileSource);

export interface ArchiveSummary {
  /** Bytes of the archive. */
  bytes: number;
  /** Hex sha256 of the archive bytes, when asked for (tests and benchmarks). */
  sha256: string | undefined;
}

export type BuilderRequest =
  | { op: 'hash'; files: FileSource[]; port: MessagePort }
  | { op: 'archive'; entries: PlannedEntry[]; digest: boolean; port: MessagePort }
  /** Write the archive straight into a container path through the engine's API, from the builder thread. */
  | { op: 'upload'; entries: PlannedEntry[]; target: UploadTarget; port: MessagePort };

export type BuilderReply =
  | { type: 'hashed'; digests: FileDigest[] }
  /** The next bytes of the archive: all of `buffer`, now owned by the main thread. */
  | { type: 'data'; buffer: ArrayBuffer }
  | { type: 'end'; summary: ArchiveSummary }
  /** `statusCode`: the engine refused an upload. */
  | { type: 'error'; message: string; statusCode?: number | undefined };

/** What the main thread sends back as its consumer takes bytes: credit to send that many more. */
export interface ArchiveAck {
  type: 'ack';
  bytes: number;
}
