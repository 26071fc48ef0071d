// A path of a sandbox copied out through the engine as a tar (its last path part at the top), read
// into memory only up to a cap: a separate verifier's artifacts, a multi-step task's workdir at a
// step boundary.
import type { Readable } from 'node:stream';
import { dockerStatusOf } from './docker-client.ts';
import type { SandboxSession } from './sandbox-session.ts';

/** The tar of a path was larger than the cap it was read with. */
export class ArchiveTooLarge extends Error {
  constructor(readonly path: string, readonly capBytes: number) {
    super(`${path} is larger than ${capBytes} bytes`);
  }
}

/** The tar of `source` in `session`, at most `capBytes` (else ArchiveTooLarge); undefined when it does not exist. */
export async function downloadArchive(session: Pick<SandboxSession, 'getArchive'>, source: string, capBytes: number, signal: AbortSignal): Promise<Buffer | undefined> {
  let stream: Readable;
  try {
    stream = await session.getArchive(source, signal);
  } catch (err) {
    if (dockerStatusOf(err) === 404) return undefined;
    throw err;
  }
  const chunks: Buffer[] = [];
  let bytes = 0;
  for await (const chunk of stream as AsyncIterable<Buffer>) {
    bytes += chunk.length;
    if (bytes > capBytes) {
      stream.destroy();
      throw new ArchiveTooLarge(source, capBytes);
    }
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}
