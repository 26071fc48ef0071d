// The Redis outage log: a flood of connection errors from one source is one "lost" line, then one
// "recovered" line with the count once a watched client is ready; other errors pass through as they
// come; names of secrets (one definition) are told apart from settings.
import { EventEmitter } from 'node:events';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { isSecretName } from '../../src/config/secret-names.ts';
import { RedisOutageLog, isConnectionError } from '../../src/redis/outage-log.ts';

function capture() {
  const lines: Array<{ msg: string; source?: string; failures?: number }> = [];
  const out = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString().trim().split('\n').map((l) => JSON.parse(l) as { msg: string }));
      done();
    },
  });
  return { lines, log: pino({ level: 'warn' }, out) };
}

const refused = () => Object.assign(new Error('connect ECONNREFUSED 127.0.0.1:6379'), { code: 'ECONNREFUSED' });

describe('RedisOutageLog', () => {
  it('logs one lost line per source and one recovered line with its count', async () => {
    const { lines, log } = capture();
    const outages = new RedisOutageLog(log);
    const client = new EventEmitter();
    outages.watchClient(client, 'connection');
    const worker = outages.listener('episodes-worker', 'worker error', 'error');
    for (let i = 0; i < 100; i++) {
      client.emit('error', refused());
      worker(new Error("Stream isn't writeable and enableOfflineQueue options is false"));
    }
    expect(outages.outages()).toEqual({ connection: 100, 'episodes-worker': 100 });
    client.emit('ready');
    await new Promise((r) => setImmediate(r));
    expect(lines.map((l) => [l.msg, l.source, l.failures])).toEqual([
      ['redis connection lost', 'connection', undefined],
      ['redis connection lost', 'episodes-worker', undefined],
      ['redis connection recovered', 'connection', 100],
      ['redis connection recovered', 'episodes-worker', 100],
    ]);
    expect(outages.outages()).toEqual({});
  });

  it('passes other errors through, every time', async () => {
    const { lines, log } = capture();
    const listener = new RedisOutageLog(log).listener('cleanup-worker', 'worker error', 'error');
    listener(new Error('ERR Error running script: missing key'));
    listener(new Error('ERR Error running script: missing key'));
    await new Promise((r) => setImmediate(r));
    expect(lines.map((l) => [l.msg, l.source])).toEqual([['worker error', 'cleanup-worker'], ['worker error', 'cleanup-worker']]);
  });

  it('tells connection errors from others', () => {
    expect(isConnectionError(refused())).toBe(true);
    expect(isConnectionError(new Error('Connection is closed.'))).toBe(true);
    expect(isConnectionError(new Error('Reached the max retries per request limit (which is 1).'))).toBe(true);
    expect(isConnectionError(new Error('WRONGTYPE Operation against a key holding the wrong kind of value'))).toBe(false);
  });
});

describe('isSecretName', () => {
  it('matches the names of secrets, not settings that mention one', () => {
    for (const name of ['apiKey', 'token', 'accessToken', 'password', 'authorization', 'Authorization', 'MODEL_API_KEY', 'FLEET_DASHBOARD_PASSWORD', 'clientSecret']) {
      expect(isSecretName(name), name).toBe(true);
    }
    for (const name of ['maxTokens', 'contextWindowTokens', 'outputReserveTokens', 'keep', 'keys', 'MODEL_MAX_TOKENS', 'name']) {
      expect(isSecretName(name), name).toBe(false);
    }
  });
});
