// Logs Redis outages once, not once per failed reconnect: ioredis emits an error on every retry of
// every connection, and BullMQ relays them on every Queue and Worker, which turned a 4.5 s outage into
// hundreds of lines per worker. Each source (a connection, a queue, a worker) logs "redis connection
// lost" on its first connection error, counts the rest, and logs "redis connection recovered" with
// that count once Redis answers again. Errors that are not about the connection are logged as they come.
import type { Logger } from 'pino';

/** The ioredis client events this needs (kept structural so any client type fits). */
export interface RedisClientEvents {
  on(event: 'error', listener: (err: Error) => void): unknown;
  on(event: 'ready', listener: () => void): unknown;
}

const CONNECTION_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EHOSTUNREACH', 'ECONNABORTED', 'EAI_AGAIN']);
const CONNECTION_MESSAGE = /ECONNREFUSED|ECONNRESET|ETIMEDOUT|EPIPE|Connection is closed|Stream isn't writeable|connect ETIMEDOUT|max retries per request/i;

/** Whether an error says Redis cannot be reached (as opposed to a command or script failing). */
export function isConnectionError(err: Error): boolean {
  const code = (err as Error & { code?: unknown }).code;
  return (typeof code === 'string' && CONNECTION_CODES.has(code)) || CONNECTION_MESSAGE.test(err.message);
}

interface Outage {
  since: number;
  failures: number;
}

export class RedisOutageLog {
  private readonly down = new Map<string, Outage>();

  constructor(private readonly log: Logger) {}

  /** Watch an ioredis client: its outages are logged once, its recovery when it is ready again. */
  watchClient(client: RedisClientEvents, source: string): void {
    client.on('error', (err) => this.error(source, err));
    client.on('ready', () => this.recovered());
  }

  /**
   * An 'error' listener for a BullMQ Queue or Worker: connection errors count toward the outage,
   * others are logged at `level` with `message`. Such a source recovers when a watched client does
   * (they talk to the same Redis), so watch at least one client beside it.
   */
  listener(source: string, message: string, level: 'warn' | 'error' = 'warn'): (err: Error) => void {
    return (err) => {
      if (isConnectionError(err)) this.error(source, err);
      else this.log[level]({ source, err: err.message }, message);
    };
  }

  /** Sources that are down now, with their failures so far (for the close log). */
  outages(): Record<string, number> {
    return Object.fromEntries([...this.down].map(([source, o]) => [source, o.failures]));
  }

  private error(source: string, err: Error): void {
    if (!isConnectionError(err)) {
      this.log.warn({ source, err: err.message }, 'redis error');
      return;
    }
    const outage = this.down.get(source);
    if (outage) {
      outage.failures += 1;
      return;
    }
    this.down.set(source, { since: Date.now(), failures: 1 });
    this.log.warn({ source, err: err.message }, 'redis connection lost');
  }

  /** Redis answers again: every source that was down logs its recovery with its count. */
  private recovered(): void {
    for (const [source, o] of this.down) {
      this.log.warn({ source, failures: o.failures, downMs: Date.now() - o.since }, 'redis connection recovered');
    }
    this.down.clear();
  }
}
