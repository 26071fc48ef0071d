// Small tars built and read whole in memory (a ready marker, an agent's input, a task's parts): one
// way to drain a tar-stream pack or entry into a Buffer, instead of a chunk loop at every call site.
// Large or untrusted archives are streamed instead (the runtime archive, safe-extract, capture-workspace).
import tar from 'tar-stream';

/**
 * Every byte of a byte stream (a finalized pack, one extracted entry) as one Buffer. Node streams
 * iterate as `unknown`, so each chunk is checked: an object-mode stream is a caller's bug, not bytes.
 */
export async function collectBytes(stream: AsyncIterable<unknown>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) {
    if (Buffer.isBuffer(chunk)) chunks.push(chunk);
    else if (chunk instanceof Uint8Array || typeof chunk === 'string') chunks.push(Buffer.from(chunk));
    else throw new TypeError(`Expected a stream of bytes, got a chunk of type \`${typeof chunk}\``);
  }
  return Buffer.concat(chunks);
}

/** A tar of the entries `add` puts into the pack (with their bodies, so the pack holds them all), as one Buffer. */
export async function tarBuffer(add: (pack: tar.Pack) => void): Promise<Buffer> {
  const pack = tar.pack();
  add(pack);
  pack.finalize();
  return collectBytes(pack);
}

/** An absolute folder of the sandbox as a tar entry's name for putArchive at "/": "/tests" is "tests/". */
export function tarFolderName(folder: string): string {
  return `${folder.replace(/^\/+/, '').replace(/\/+$/, '')}/`;
}
