// What the model proxy adds to a streamed chat call: first-token latency and total time of the same
// streamed call straight to the scripted policy server and through an episode's proxy (Unix socket,
// budgets, evidence, the stream parsed, reassembled and relayed event by event), in the same run,
// alternating per round. The stub runs as its own process (the compiled CLI), the client in another,
// the proxy in this one, as in a worker. Prints p50/p90 of both, the added milliseconds and ratios
// (goal: under 5 ms added to the first token at p50).
// Run: npm run build && npx tsx bench/model-stream.ts [--rounds 200] [--chunk-delay-ms 0]
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp } from 'node:fs/promises';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy } from '../src/model/model-proxy.ts';

const BIN = fileURLToPath(new URL('../dist/src/cli/bin.js', import.meta.url));
const TASKS = fileURLToPath(new URL('../examples/tasks', import.meta.url));
const { values } = parseArgs({
  options: {
    rounds: { type: 'string', default: '200' },
    client: { type: 'boolean', default: false },
    direct: { type: 'string' },
    socket: { type: 'string' },
  },
});
const rounds = Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 1) throw new TypeError(`--rounds: expected an integer from 1 up, got ${values.rounds}`);

const BODY = JSON.stringify({
  model: 'bench',
  stream: true,
  messages: [{ role: 'system', content: 'You are an agent.' }, { role: 'user', content: 'Fix greet.sh.' }],
});

interface Timing {
  firstTokenMs: number;
  totalMs: number;
  events: number;
}

/** One streamed call: time to the first event carrying generated text, and to [DONE]. */
function streamOnce(where: { socketPath: string } | { host: string; port: number }): Promise<Timing> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = http.request({ ...where, path: '/v1/chat/completions', method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(BODY), 'x-rollout-task': 'fix-greeting' } }, (res) => {
      let firstTokenMs: number | undefined;
      let events = 0;
      let buffer = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buffer += chunk;
        let end: number;
        while ((end = buffer.indexOf('\n\n')) !== -1) {
          const data = buffer.slice(6, end);
          buffer = buffer.slice(end + 2);
          events += 1;
          if (firstTokenMs === undefined && /"(content|arguments)":"[^"]/.test(data)) firstTokenMs = performance.now() - started;
        }
      });
      res.on('end', () => {
        if (res.statusCode !== 200 || firstTokenMs === undefined) reject(new Error(`status ${res.statusCode}, ${events} events`));
        else resolve({ firstTokenMs, totalMs: performance.now() - started, events });
      });
    });
    req.on('error', reject);
    req.end(BODY);
  });
}

if (values.client) {
  // The client process: alternate direct and proxied calls, print one JSON line of timings.
  const direct = new URL(values.direct!);
  const out: Record<'direct' | 'proxy', Timing[]> = { direct: [], proxy: [] };
  const warm = 20;
  for (let i = 0; i < rounds + warm; i++) {
    const order = i % 2 === 0 ? (['direct', 'proxy'] as const) : (['proxy', 'direct'] as const);
    for (const which of order) {
      const t = await streamOnce(which === 'direct' ? { host: direct.hostname, port: Number(direct.port) } : { socketPath: values.socket! });
      if (i >= warm) out[which].push(t);
    }
  }
  process.stdout.write(`${JSON.stringify(out)}\n`);
  process.exit(0);
}

const pct = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor((p / 100) * s.length))]!;
};

async function firstLine(child: ChildProcess): Promise<string> {
  const lines = createInterface({ input: child.stdout! });
  const [line] = (await once(lines, 'line')) as [string];
  lines.close();
  return line;
}

const stub = spawn(process.execPath, [BIN, 'model-stub', '--port', '0', '--tasks', TASKS], { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, LOG_LEVEL: 'warn' } });
try {
  const baseUrl = (await firstLine(stub)).trim();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-bench-stream-'));
  const proxy = await startModelProxy({
    socketPath: modelSocketPath(dir, 'bench'),
    upstreamBaseUrl: baseUrl,
    budget: { maxCalls: 1_000_000, maxTokens: 1_000_000_000 },
    evidenceFile: path.join(dir, MODEL_CALLS_FILE),
    episodeId: 'bench',
    taskId: 'fix-greeting',
    log: pino({ level: 'silent' }),
  });
  const client = spawn(process.execPath, [...process.execArgv, fileURLToPath(import.meta.url), '--client', '--rounds', String(rounds), '--direct', baseUrl, '--socket', proxy.socketPath], { stdio: ['ignore', 'pipe', 'inherit'] });
  const result = JSON.parse(await firstLine(client)) as Record<'direct' | 'proxy', Timing[]>;
  await proxy.close();
  const row = (name: string, key: 'firstTokenMs' | 'totalMs') => {
    const d = result.direct.map((t) => t[key]);
    const p = result.proxy.map((t) => t[key]);
    const f = (x: number) => x.toFixed(2).padStart(7);
    console.log(`${name.padEnd(12)} direct p50 ${f(pct(d, 50))} p90 ${f(pct(d, 90))} | proxy p50 ${f(pct(p, 50))} p90 ${f(pct(p, 90))} | added p50 ${f(pct(p, 50) - pct(d, 50))} ms | ratio p50 ${(pct(p, 50) / pct(d, 50)).toFixed(2)}x`);
  };
  console.log(`streamed chat calls: ${rounds} rounds each way (after 20 warm-up), ${result.proxy[0]!.events} events a call`);
  row('first token', 'firstTokenMs');
  row('total', 'totalMs');
} finally {
  stub.kill('SIGTERM');
}
