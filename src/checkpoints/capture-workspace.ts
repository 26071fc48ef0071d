// Reads a workspace tar stream into memory up to a cap, hashing it on the way. Past the cap (or on a
// stream error or deadline) the stream is destroyed and the checkpoint records why nothing was kept.
import { createHash } from 'node:crypto';
import type { Readable } from 'node:stream';
import { WORKSPACE_TAR, type CheckpointWorkspace } from './checkpoint.ts';

export interface CapturedWorkspace {
  workspace: CheckpointWorkspace;
  /** The tar's bytes when captured. */
  data?: Buffer;
}

export async function captureWorkspace(tar: Readable | undefined, capBytes: number, timeoutMs: number): Promise<CapturedWorkspace> {
  if (tar === undefined) return { workspace: { captured: false, reason: 'no snapshot offered' } };
  const hash = createHash('sha256');
  const chunks: Buffer[] = [];
  let bytes = 0;
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    tar.destroy(new Error(`not read within ${timeoutMs} ms`));
  }, timeoutMs);
  try {
    for await (const chunk of tar) {
      const buf = typeof chunk === 'string' ? Buffer.from(chunk) : (chunk as Buffer);
      bytes += buf.length;
      // Returning from for-await destroys the stream: the rest is never read into memory.
      if (bytes > capBytes) return { workspace: { captured: false, reason: `larger than ${capBytes} bytes` } };
      hash.update(buf);
      chunks.push(buf);
    }
  } catch (err) {
    return { workspace: { captured: false, reason: `snapshot ${timedOut ? 'timed out' : 'failed'}: ${(err as Error).message}` } };
  } finally {
    clearTimeout(timer);
  }
  return { workspace: { captured: true, file: WORKSPACE_TAR, bytes, sha256: hash.digest('hex') }, data: Buffer.concat(chunks, bytes) };
}
