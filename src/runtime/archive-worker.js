// @ts-check
// The runtime builder thread: serves hash, upload and archive requests, each on its own MessagePort.
// An upload streams the archive from here straight to the engine (the main thread never sees a byte).
// An archive goes back to the main thread chunk by chunk, each chunk's memory transferred (moved, not
// copied), at most 16 MiB ahead of what the main thread's consumer took, so a slow consumer holds the
// builder back. Copying instead (into pooled or fresh buffers, then out again) tripled the CPU cost.
import { PassThrough, Writable } from 'node:stream';
import { parentPort } from 'node:worker_threads';
import { uploadArchive } from '../sandbox/archive-upload.js';
import { hashFiles, writeArchive } from './archive-ops.js';

/** @typedef {import('./archive-protocol.ts').BuilderRequest} BuilderRequest */
/** @typedef {import('./archive-protocol.ts').BuilderReply} BuilderReply */
/** @typedef {import('./archive-protocol.ts').ArchiveAck} ArchiveAck */
/** @typedef {import('node:worker_threads').MessagePort} MessagePort */

/** Keep in step with ARCHIVE_WINDOW_BYTES in archive-protocol.ts (this thread cannot load TypeScript). */
const WINDOW_BYTES = 16 * 1024 * 1024;

/**
 * @param {MessagePort} port
 * @param {BuilderReply} reply
 * @param {ArrayBuffer[]} [transfer]
 */
const send = (port, reply, transfer) => port.postMessage(reply, transfer);

/**
 * The chunk's memory as an ArrayBuffer this thread may give away. File data arrives in buffers of its
 * own (fs read streams allocate one per read, and nothing upstream keeps it once passed on); small
 * chunks (tar headers, padding, inline files) may share a pool slab with other buffers: those are copied.
 * @param {Buffer} chunk
 * @returns {ArrayBuffer}
 */
function movable(chunk) {
  const whole = chunk.byteOffset === 0 && chunk.byteLength === chunk.buffer.byteLength && chunk.buffer instanceof ArrayBuffer;
  if (whole && chunk.byteLength >= 64 * 1024) return /** @type {ArrayBuffer} */ (chunk.buffer);
  const copy = new ArrayBuffer(chunk.byteLength);
  new Uint8Array(copy).set(chunk);
  return copy;
}

/**
 * @param {MessagePort} port
 * @param {AbortController} cancel
 */
function portSink(port, cancel) {
  let inflight = 0;
  /** @type {(() => void) | undefined} */
  let blocked;
  port.on('message', (/** @type {ArchiveAck} */ msg) => {
    inflight -= msg.bytes;
    if (blocked && inflight < WINDOW_BYTES) {
      const resume = blocked;
      blocked = undefined;
      resume();
    }
  });
  // The main thread closed its end: nobody reads the archive any more, stop reading files.
  port.once('close', () => cancel.abort(new Error('the archive consumer went away')));
  return new Writable({
    highWaterMark: 1024 * 1024,
    write(/** @type {Buffer} */ chunk, _enc, cb) {
      const buffer = movable(chunk);
      inflight += buffer.byteLength;
      send(port, { type: 'data', buffer }, [buffer]);
      if (inflight < WINDOW_BYTES) cb();
      else blocked = () => cb();
    },
  });
}

/** @param {BuilderRequest} request */
async function serve(request) {
  const { port } = request;
  try {
    if (request.op === 'hash') {
      send(port, { type: 'hashed', digests: await hashFiles(request.files) });
    } else if (request.op === 'upload') {
      const cancel = new AbortController();
      // The main thread closes its end when its deadline passes or it gives up: stop the upload.
      port.once('close', () => cancel.abort(new Error('the upload was cancelled')));
      const tar = new PassThrough({ highWaterMark: 1024 * 1024 });
      const packed = writeArchive(request.entries, tar, { signal: cancel.signal });
      const uploaded = uploadArchive(request.target, tar, cancel.signal);
      try {
        const [summary] = await Promise.all([packed, uploaded]);
        send(port, { type: 'end', summary });
      } catch (err) {
        cancel.abort(err);
        throw err;
      }
    } else {
      const cancel = new AbortController();
      const summary = await writeArchive(request.entries, portSink(port, cancel), { digest: request.digest, signal: cancel.signal });
      send(port, { type: 'end', summary });
    }
  } catch (err) {
    const statusCode = /** @type {{ statusCode?: number }} */ (err).statusCode;
    send(port, { type: 'error', message: err instanceof Error ? err.message : String(err), statusCode });
  } finally {
    port.close();
  }
}

parentPort?.on('message', (/** @type {BuilderRequest} */ request) => void serve(request));
