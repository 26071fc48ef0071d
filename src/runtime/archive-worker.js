// @ts-check
// The runtime builder thread: serves hash and archive requests, each on its own MessagePort. An
// archive streams back in chunks under a credit window (the main thread acknowledges what it consumed),
// so neither thread holds the whole archive and the main thread only forwards bytes.
import { Writable } from 'node:stream';
import { parentPort } from 'node:worker_threads';
import { hashFiles, writeArchive } from './archive-ops.js';

/** @typedef {import('./archive-protocol.ts').BuilderRequest} BuilderRequest */
/** @typedef {import('./archive-protocol.ts').BuilderReply} BuilderReply */
/** @typedef {import('./archive-protocol.ts').ArchiveAck} ArchiveAck */

/** Keep in step with ARCHIVE_WINDOW_BYTES in archive-protocol.ts (this thread cannot load TypeScript). */
const WINDOW_BYTES = 8 * 1024 * 1024;

/**
 * @param {import('node:worker_threads').MessagePort} port
 * @param {BuilderReply} reply
 * @param {ArrayBuffer[]} [transfer]
 */
const send = (port, reply, transfer) => port.postMessage(reply, transfer);

/**
 * Posts each chunk (copied into its own buffer, then transferred) and holds the writer past the window.
 * @param {import('node:worker_threads').MessagePort} port
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
      const copy = new Uint8Array(chunk.length);
      copy.set(chunk);
      inflight += copy.length;
      send(port, { type: 'data', chunk: copy }, [copy.buffer]);
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
    } else {
      const cancel = new AbortController();
      const summary = await writeArchive(request.entries, portSink(port, cancel), cancel.signal);
      send(port, { type: 'end', summary });
    }
  } catch (err) {
    send(port, { type: 'error', message: err instanceof Error ? err.message : String(err) });
  } finally {
    port.close();
  }
}

parentPort?.on('message', (/** @type {BuilderRequest} */ request) => void serve(request));
