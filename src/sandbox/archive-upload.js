// @ts-check
// PUT a tar stream into a container path through the engine's HTTP API (what `docker cp -` does),
// for the runtime builder thread: the archive goes from the thread that packs it straight to the
// engine's socket, so the main thread's event loop and heap never see the ~100 MB. Plain JavaScript
// because it runs in that thread (see src/runtime/archive-ops.js). The caller bounds it with a signal.
import http from 'node:http';
import { pipeline } from 'node:stream/promises';

/**
 * How to reach the engine: a Unix socket, or plain HTTP host and port (the transports createDocker builds).
 * @typedef {{ socketPath: string } | { host: string; port: number }} EngineAddress
 */

/**
 * @typedef {object} UploadTarget
 * @property {EngineAddress} address
 * @property {string} [apiVersion] e.g. "v1.41"; none: the engine's default
 * @property {string} containerId
 * @property {string} path where the archive is extracted, in the container
 */

/**
 * Stream `source` (a tar) into the target; resolves once the engine extracted it all.
 * Rejects with an Error carrying the engine's `statusCode` and message when it refuses.
 * @param {UploadTarget} target
 * @param {NodeJS.ReadableStream} source
 * @param {AbortSignal} signal
 * @returns {Promise<void>}
 */
export async function uploadArchive(target, source, signal) {
  const query = new URLSearchParams({ path: target.path });
  const req = http.request({
    ...target.address,
    method: 'PUT',
    path: `${target.apiVersion ? `/${target.apiVersion}` : ''}/containers/${encodeURIComponent(target.containerId)}/archive?${query}`,
    headers: { 'Content-Type': 'application/x-tar', 'Transfer-Encoding': 'chunked' },
    signal,
  });
  /** @type {Promise<http.IncomingMessage>} */
  const response = new Promise((resolve, reject) => {
    req.once('response', resolve);
    req.once('error', reject);
  });
  // The engine may answer (an error) before reading the whole body: settle on the answer.
  const sent = pipeline(source, req);
  sent.catch(() => undefined);
  const res = await response;
  let body = '';
  res.setEncoding('utf8');
  for await (const chunk of res) body += chunk;
  if (res.statusCode === 200) {
    await sent;
    return;
  }
  let message = body.trim();
  try {
    message = JSON.parse(body).message ?? message;
  } catch {
    // not JSON: keep the text
  }
  throw Object.assign(new Error(`engine answered ${res.statusCode}: ${message}`), { statusCode: res.statusCode });
}
