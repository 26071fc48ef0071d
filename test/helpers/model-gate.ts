// A loopback relay between the fleet's model proxies and the scripted policy server that holds the
// chat calls a test picks until it releases them: a bump of the policy version, a kill, lands at a known
// point of each conversation. Calls it does not hold pass straight through.
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { ModelStub } from '../../src/model/model-stub.ts';
import { waitFor } from './fleet.ts';

export interface GateCall {
  episodeId: string;
  /** Assistant messages in the request (the stub's turn); -1 when the body is not a chat request. */
  turn: number;
  /** Times this (episode, turn) reached the gate, this one included. */
  nth: number;
}

export type Gate = Awaited<ReturnType<typeof startGate>>;

/** A loopback relay in front of the stub that holds the calls `hold` picks until released. */
export async function startGate(stub: ModelStub) {
  const upstream = new URL(stub.baseUrl!);
  const seen = new Map<string, number>();
  const held: Array<{ call: GateCall; release: () => void }> = [];
  let hold: (c: GateCall) => boolean = () => false;
  const server = http.createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      let turn = -1;
      try {
        const json = JSON.parse(body.toString('utf8')) as { messages?: { role: string }[] };
        turn = (json.messages ?? []).filter((m) => m.role === 'assistant').length;
      } catch { /* not a chat call: passed on as is */ }
      const episodeId = String(req.headers['x-rollout-episode'] ?? '');
      const key = `${episodeId}\0${turn}`;
      const call = { episodeId, turn, nth: (seen.get(key) ?? 0) + 1 };
      seen.set(key, call.nth);
      const forward = () => {
        // A held caller that died meanwhile (its worker killed) gets nothing; the stub never hears of it.
        if (res.destroyed || req.socket.destroyed) return;
        const out = http.request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers }, (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        });
        out.on('error', () => res.destroy());
        out.end(body);
      };
      if (req.method === 'POST' && hold(call)) held.push({ call, release: forward });
      else forward();
    });
  });
  server.listen(0, '127.0.0.1');
  await new Promise((r) => server.once('listening', r));
  return {
    baseUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    held,
    setHold(pick: (c: GateCall) => boolean) {
      hold = pick;
    },
    /** Wait until `n` calls whose episode starts with `batchId` are held. */
    async waitHeld(batchId: string, n: number) {
      await waitFor(`${n} held calls of ${batchId}`, async () => held.filter((h) => h.call.episodeId.startsWith(`${batchId}.`)).length >= n, 120_000, 50);
    },
    /** Release the held calls of `batchId` (every one when unset). */
    release(batchId?: string) {
      for (let i = held.length - 1; i >= 0; i--) {
        if (batchId === undefined || held[i]!.call.episodeId.startsWith(`${batchId}.`)) held.splice(i, 1)[0]!.release();
      }
    },
    close: () => new Promise<void>((r) => {
      server.close(() => r());
      server.closeAllConnections();
    }),
  };
}

