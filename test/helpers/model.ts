// HTTP from the host side to the model proxy (over its Unix socket) and the scripted policy server
// (over loopback), as the agent inside a sandbox would call them.
import http from 'node:http';
import net from 'node:net';
import path from 'node:path';
import { EXAMPLES } from './fleet.ts';

export const EXAMPLE_TASKS = path.join(EXAMPLES, 'tasks');

export interface HttpAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
  /** The body parsed as JSON (undefined when it is not JSON); assert its shape with expect. */
  json: unknown;
}

export type Target = { socketPath: string } | { baseUrl: string };

/** Send a request; `body` is sent as JSON unless it is a string or Buffer (sent as is). */
export function request(target: Target, method: string, urlPath: string, body?: unknown, headers: Record<string, string> = {}): Promise<HttpAnswer> {
  const payload = body === undefined ? undefined : typeof body === 'string' || Buffer.isBuffer(body) ? Buffer.from(body) : Buffer.from(JSON.stringify(body));
  const where = 'socketPath' in target
    ? { socketPath: target.socketPath, path: urlPath }
    : (() => {
        const u = new URL(target.baseUrl.replace(/\/v1$/, '') + urlPath);
        return { host: u.hostname, port: u.port, path: u.pathname };
      })();
  return new Promise((resolve, reject) => {
    const req = http.request(
      { ...where, method, agent: false, headers: { ...(payload ? { 'content-type': 'application/json', 'content-length': payload.length } : {}), ...headers } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json: unknown;
          try {
            json = JSON.parse(text);
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, headers: res.headers, text, json });
        });
        res.on('error', reject);
      },
    );
    // A server may answer (413) before the whole body is written and close; the answer still counts.
    req.on('error', reject);
    req.end(payload);
  });
}

export const chat = (target: Target, body: unknown, headers: Record<string, string> = {}) => request(target, 'POST', '/v1/chat/completions', body, headers);

/** A conversation of `turns` scripted exchanges: user, then (assistant tool call, tool result) pairs. */
export function conversation(instruction: string, turns: { toolCallId: string; name: string; arguments: string; result: string }[] = []) {
  return [
    { role: 'system', content: 'You are an agent. Use the tools.' },
    { role: 'user', content: instruction },
    ...turns.flatMap((t) => [
      { role: 'assistant', content: null, tool_calls: [{ id: t.toolCallId, type: 'function', function: { name: t.name, arguments: t.arguments } }] },
      { role: 'tool', tool_call_id: t.toolCallId, content: t.result },
    ]),
  ];
}

interface ChatAnswerShape {
  choices?: { message?: { content?: string | null; tool_calls?: { id: string; function: { name: string; arguments: string } }[] } }[];
  usage?: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
  error?: { type: string; message: string } & Record<string, unknown>;
}

/** The answer's body, read as a chat completion or an error. */
export const bodyOf = (answer: HttpAnswer): ChatAnswerShape => (answer.json ?? {}) as ChatAnswerShape;

/** The one tool call of a chat completion answer, arguments parsed. */
export function toolCallOf(answer: HttpAnswer): { id: string; name: string; args: Record<string, unknown> } | undefined {
  const call = bodyOf(answer).choices?.[0]?.message?.tool_calls?.[0];
  return call === undefined ? undefined : { id: call.id, name: call.function.name, args: JSON.parse(call.function.arguments) as Record<string, unknown> };
}

/** A loopback port nothing listens on (it was free a moment ago). */
export async function closedPort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve));
  const { port } = srv.address() as net.AddressInfo;
  await new Promise<void>((resolve) => srv.close(() => resolve()));
  return port;
}

export const TOOLS = ['bash', 'read_file', 'write_file', 'finish'].map((name) => ({ type: 'function', function: { name, parameters: { type: 'object' } } }));

export interface StreamedAnswer {
  status: number;
  headers: http.IncomingHttpHeaders;
  /** The `data:` payloads in the order they arrived, `[DONE]` included. */
  events: string[];
  /** The body when the answer was not an event stream (an error). */
  text: string;
}

/**
 * POST a streamed chat call and collect its events as they arrive. `onEvent` sees each one the moment
 * it is parsed; returning 'disconnect' destroys the connection there (a client that goes away).
 */
export function streamChat(target: Target, body: unknown, onEvent?: (data: string, index: number) => 'disconnect' | void): Promise<StreamedAnswer> {
  const payload = Buffer.from(JSON.stringify(body));
  const where = 'socketPath' in target
    ? { socketPath: target.socketPath, path: '/v1/chat/completions' }
    : (() => {
        const u = new URL(`${target.baseUrl}/chat/completions`);
        return { host: u.hostname, port: u.port, path: u.pathname };
      })();
  return new Promise((resolve, reject) => {
    const req = http.request({ ...where, method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': payload.length } }, (res) => {
      const events: string[] = [];
      let buffer = '';
      let text = '';
      const done = () => resolve({ status: res.statusCode ?? 0, headers: res.headers, events, text });
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        text += chunk;
        buffer += chunk;
        let end: number;
        while ((end = buffer.indexOf('\n\n')) !== -1) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split('\n').filter((l) => l.startsWith('data: ')).map((l) => l.slice(6)).join('\n');
          if (data === '') continue;
          events.push(data);
          if (onEvent?.(data, events.length - 1) === 'disconnect') {
            req.destroy();
            done();
            return;
          }
        }
      });
      res.on('end', done);
      res.on('error', () => done());
    });
    req.on('error', (err) => (req.destroyed ? undefined : reject(err)));
    req.end(payload);
  });
}
