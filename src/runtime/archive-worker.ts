// The runtime builder thread: serves hash, upload and archive requests, each on its own MessagePort.
// An upload streams the archive from here straight to the engine (the main thread never sees a byte).
// An archive goes back to the main thread chunk by chunk, each chunk's memory transferred (moved, not
// copied), at most ARCHIVE_WINDOW_BYTES ahead of what the main thread's consumer took, so a slow
// consumer holds the builder back. Copying instead (into pooled or fresh buffers, then out again)
// tripled the CPU cost. Started by build-off-thread.ts; compiled, it loads no TypeScript tooling.
import { PassThrough, Writable } from 'node:stream';
import { parentPort, type MessagePort } from 'node:worker_threads';
import { uploadArchive } from '../sandbox/archive-upload.ts';
import { hashFiles, writeArchive } from './archive-ops.ts';
import { ARCHIVE_WINDOW_BYTES, type ArchiveAck, type BuilderReply, type BuilderRequest } from './archive-protocol.ts';

const send = (port: MessagePort, reply: BuilderReply, transfer?: ArrayBuffer[]) => port.postMessage(reply, transfer);

/**
 * The chunk's memory as an ArrayBuffer this thread may give away. File data arrives in buffers of its
 * own (fs read streams allocate one per read, and nothing upstream keeps it once passed on); small
 * chunks (tar headers, padding, inline files) may share a pool slab with other buffers: those are copied.
 */
function movable(chunk: Buffer): ArrayBuffer {
  const whole = chunk.byteOffset === 0 && chunk.byteLength === chunk.buffer.byteLength && chunk.buffer instanceof ArrayBuffer;
  if (whole && chunk.byteLength >= 64 * 1024) return chunk.buffer;
  const copy = new ArrayBuffer(chunk.byteLength);
  new Uint8Array(copy).set(chunk);
  return copy;
}

function portSink(port: MessagePort, cancel: AbortController): Writable {
  let inflight = 0;
  let blocked: (() => void) | undefined;
  port.on('message', (msg: ArchiveAck) => {
    inflight -= msg.bytes;
    if (blocked && inflight < ARCHIVE_WINDOW_BYTES) {
      const resume = blocked;
      blocked = undefined;
      resume();
    }
  });
  // The main thread closed its end: nobody reads the archive any more, stop reading files.
  port.once('close', () => cancel.abort(new Error('the archive consumer went away')));
  return new Writable({
    highWaterMark: 1024 * 1024,
    write(chunk: Buffer, _enc, cb) {
      const buffer = movable(chunk);
      inflight += buffer.byteLength;
      send(port, { type: 'data', buffer }, [buffer]);
      if (inflight < ARCHIVE_WINDOW_BYTES) cb();
      else blocked = () => cb();
    },
  });
}

async function serve(request: BuilderRequest): Promise<void> {
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
    const { statusCode } = err as { statusCode?: number };
    send(port, { type: 'error', message: err instanceof Error ? err.message : String(err), statusCode });
  } finally {
    port.close();
  }
}

parentPort?.on('message', (request: BuilderRequest) => void serve(request));
