// PUT a tar stream into a container path through the engine's HTTP API (what `docker cp -` does),
// for the runtime builder thread: the archive goes from the thread that packs it straight to the
// engine's socket, so the main thread's event loop and heap never see the ~100 MB. It imports only
// node: modules, so the thread starts without loading dockerode. The caller bounds it with a signal.
import http from 'node:http';
import { pipeline } from 'node:stream/promises';

/** How to reach the engine: a Unix socket, or plain HTTP host and port (the transports createDocker builds). */
export type EngineAddress = { socketPath: string } | { host: string; port: number };

export interface UploadTarget {
  address: EngineAddress;
  /** e.g. "v1.41"; none: the engine's default */
  apiVersion?: string | undefined;
  containerId: string;
  /** Where the archive is extracted, in the container. */
  path: string;
}

/**
 * Stream `source` (a tar) into the target; resolves once the engine extracted it all.
 * Rejects with an Error carrying the engine's `statusCode` and message when it refuses.
 */
export async function uploadArchive(target: UploadTarget, source: NodeJS.ReadableStream, signal: AbortSignal): Promise<void> {
  const query = new URLSearchParams({ path: target.path });
  const req = http.request({
    ...target.address,
    method: 'PUT',
    path: `${target.apiVersion ? `/${target.apiVersion}` : ''}/containers/${encodeURIComponent(target.containerId)}/archive?${query}`,
    headers: { 'Content-Type': 'application/x-tar', 'Transfer-Encoding': 'chunked' },
    signal,
  });
  const response = new Promise<http.IncomingMessage>((resolve, reject) => {
    req.once('response', resolve);
    req.once('error', reject);
  });
  // The engine may answer (an error) before reading the whole body: settle on the answer.
  const sent = pipeline(source, req);
  sent.catch(() => undefined);
  const res = await response;
  let body = '';
  res.setEncoding('utf8');
  for await (const chunk of res) body += chunk as string;
  if (res.statusCode === 200) {
    await sent;
    return;
  }
  let message = body.trim();
  try {
    const parsed: unknown = JSON.parse(body);
    if (typeof parsed === 'object' && parsed !== null && 'message' in parsed && typeof parsed.message === 'string') message = parsed.message;
  } catch {
    // not JSON: keep the text
  }
  throw Object.assign(new Error(`engine answered ${res.statusCode}: ${message}`), { statusCode: res.statusCode });
}
