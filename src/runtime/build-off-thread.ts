// The runtime builder thread, seen from the main thread: one long-lived worker per process (started on
// first use, unref'd, stopped after a minute idle) hashes files and writes archives. An archive comes
// back as a Readable fed by transferred (moved, not copied) chunks, acknowledged as it is consumed, so
// a slow consumer (the Docker engine) holds the builder back instead of filling memory.
import { Readable } from 'node:stream';
import { MessageChannel, type MessagePort, type Worker } from 'node:worker_threads';
import { FleetError } from '../errors/fleet-error.ts';
import { siblingModule, startThread } from '../package-paths.ts';
import type { UploadTarget } from '../sandbox/archive-upload.ts';
import type { ArchiveAck, ArchiveSummary, BuilderReply, BuilderRequest, FileDigest, FileSource, PlannedEntry } from './archive-protocol.ts';

/** archive-worker.js beside the compiled build; archive-worker.ts under tsx and vitest. */
const WORKER_ENTRY = siblingModule(import.meta.url, 'archive-worker');
/** An idle builder thread is stopped after this long; the next build starts a new one. */
const IDLE_STOP_MS = 60_000;

let thread: Worker | undefined;
let pending = 0;
let idleTimer: NodeJS.Timeout | undefined;

function builderThread(): Worker {
  if (idleTimer) clearTimeout(idleTimer);
  idleTimer = undefined;
  if (thread) return thread;
  // Not the parent's execArgv: a parent run through tsx would start a loader thread in it too (0.3 s+).
  const worker = startThread(WORKER_ENTRY, { name: 'runtime-builder' });
  worker.unref();
  const forget = () => {
    if (thread === worker) thread = undefined;
  };
  worker.once('exit', forget);
  // A crashed thread fails its requests in flight through their ports' close events.
  worker.on('error', forget);
  thread = worker;
  return worker;
}

/** Send one request to the builder thread; returns the port its replies arrive on. */
function request(make: (port: MessagePort) => BuilderRequest): MessagePort {
  const { port1, port2 } = new MessageChannel();
  const worker = builderThread();
  pending++;
  port1.once('close', () => {
    if (--pending === 0 && thread === worker) idleTimer = setTimeout(() => void worker.terminate(), IDLE_STOP_MS).unref();
  });
  worker.postMessage(make(port2), [port2]);
  return port1;
}

/** Stop the builder thread now (tests, benchmarks, shutdown); the next build starts a new one. */
export async function stopRuntimeBuilder(): Promise<void> {
  const worker = thread;
  thread = undefined;
  if (idleTimer) clearTimeout(idleTimer);
  if (worker) await worker.terminate();
}

const builderError = (message: string) => new FleetError('runtime_unavailable', `runtime builder: ${message}`);

/** Size and sha256 of each file, computed in the builder thread. */
export async function hashFilesOffThread(files: FileSource[]): Promise<FileDigest[]> {
  const port = request((p) => ({ op: 'hash', files, port: p }));
  return new Promise<FileDigest[]>((resolve, reject) => {
    port.on('message', (reply: BuilderReply) => {
      if (reply.type === 'hashed') resolve(reply.digests);
      else reject(builderError(reply.type === 'error' ? reply.message : `unexpected reply ${reply.type}`));
      port.close();
    });
    port.once('close', () => reject(builderError('the thread stopped before answering')));
  });
}

/**
 * Write the planned archive straight into a container path from the builder thread. Aborting `signal`
 * stops it. An engine refusal rejects with an Error carrying the engine's `statusCode`.
 */
export async function uploadOffThread(entries: PlannedEntry[], target: UploadTarget, signal: AbortSignal): Promise<ArchiveSummary> {
  signal.throwIfAborted();
  const port = request((p) => ({ op: 'upload', entries, target, port: p }));
  return new Promise<ArchiveSummary>((resolve, reject) => {
    const onAbort = () => {
      reject(signal.reason);
      port.close();
    };
    signal.addEventListener('abort', onAbort, { once: true });
    port.on('message', (reply: BuilderReply) => {
      if (reply.type === 'end') resolve(reply.summary);
      else if (reply.type === 'error' && reply.statusCode !== undefined) reject(Object.assign(new Error(reply.message), { statusCode: reply.statusCode }));
      else reject(builderError(reply.type === 'error' ? reply.message : `unexpected reply ${reply.type}`));
      signal.removeEventListener('abort', onAbort);
      port.close();
    });
    port.once('close', () => reject(builderError('the thread stopped before the upload ended')));
  });
}

export interface ArchiveStream {
  /** The archive bytes; destroying it stops the build. */
  stream: Readable;
  /** Size and sha256 of the archive once its last byte was written; rejects with the stream's error. */
  summary: Promise<ArchiveSummary>;
}

/** Write the planned archive in the builder thread, as a stream. */
export function archiveOffThread(entries: PlannedEntry[], digest: boolean): ArchiveStream {
  const port = request((p) => ({ op: 'archive', entries, digest, port: p }));
  /** Bytes pushed while the consumer was behind: acknowledged when it asks for more. */
  let unacked = 0;
  let finished = false;
  let settle!: { resolve: (s: ArchiveSummary) => void; reject: (e: Error) => void };
  const summary = new Promise<ArchiveSummary>((resolve, reject) => (settle = { resolve, reject }));
  summary.catch(() => undefined); // the stream carries the same error to whoever reads it

  const ack = (bytes: number) => port.postMessage({ type: 'ack', bytes } satisfies ArchiveAck);
  const stream = new Readable({
    highWaterMark: 4 * 1024 * 1024,
    read() {
      if (unacked > 0) {
        ack(unacked);
        unacked = 0;
      }
    },
    destroy(err, cb) {
      if (!finished) {
        finished = true;
        settle.reject(err ?? builderError('the archive stream was closed before its end'));
      }
      port.close();
      cb(err);
    },
  });
  port.on('message', (reply: BuilderReply) => {
    if (reply.type === 'data') {
      // The memory was moved here, not copied: wrap it as it is.
      const bytes = Buffer.from(reply.buffer);
      if (stream.push(bytes)) ack(bytes.length);
      else unacked += bytes.length;
    } else if (reply.type === 'end') {
      finished = true;
      settle.resolve(reply.summary);
      stream.push(null);
    } else {
      stream.destroy(builderError(reply.type === 'error' ? reply.message : `unexpected reply ${reply.type}`));
    }
  });
  port.once('close', () => {
    if (!finished) stream.destroy(builderError('the thread stopped before the archive ended'));
  });
  return { stream, summary };
}
