// Which tasks wait in the episodes queue (src/worker/upcoming-tasks.ts), read from a real BullMQ queue
// on a private Redis: more of a task waiting besides the asker, none once they started, the look
// bounded, and a queue that cannot be read, or never answers, answering "none".
import net from 'node:net';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPrivateRedis, type PrivateRedis } from '../../src/cli/private-redis.ts';
import { EPISODES_QUEUE } from '../../src/episode/episode-job.ts';
import { LOOK_AHEAD, READ_BOUND_MS, UpcomingTasks } from '../../src/worker/upcoming-tasks.ts';
import { silentLog } from '../helpers/fleet.ts';

const digest = (c: string) => c.repeat(64);

describe('upcoming tasks', () => {
  let redis: PrivateRedis;
  let connection: Redis;
  let queue: Queue;

  beforeAll(async () => {
    redis = await startPrivateRedis();
    connection = new Redis(redis.url, { maxRetriesPerRequest: null });
    queue = new Queue(EPISODES_QUEUE, { connection, prefix: 'upcoming-test' });
  });
  afterAll(async () => {
    await queue?.close();
    await connection?.quit();
    await redis?.stop();
  });

  const add = (episodeId: string, taskDigest: string) => queue.add('episode', { episodeId, taskDigest }, { jobId: episodeId });

  it('says more of a task wait while another of its episodes is in the queue, not counting the asker or what started since', async () => {
    await queue.obliterate({ force: true });
    for (const s of [0, 1, 2]) await add(`b.a.${s}`, digest('a'));
    await add('b.b.0', digest('b'));
    // One read for the whole test (fresh for a minute).
    const upcoming = new UpcomingTasks(queue, silentLog, 60_000);
    // b.a.0 is taken by this worker (still listed as waiting in this read): a.1 and a.2 are coming.
    expect(await upcoming.moreOf(digest('a'), 'b.a.0')).toBe(true);
    // b's only episode asks: nothing more of b.
    expect(await upcoming.moreOf(digest('b'), 'b.b.0')).toBe(false);
    expect(await upcoming.moreOf(digest('c'), 'b.c.0')).toBe(false);
    // Within one read, the ones that asked count as started: a.2, the last, sees none more.
    expect(await upcoming.moreOf(digest('a'), 'b.a.1')).toBe(true);
    expect(await upcoming.moreOf(digest('a'), 'b.a.2')).toBe(false);
  });

  it('reads the queue again once its look is stale, and looks at LOOK_AHEAD episodes only', async () => {
    await queue.obliterate({ force: true });
    // Every question reads the queue afresh.
    const upcoming = new UpcomingTasks(queue, silentLog, 0);
    expect(await upcoming.moreOf(digest('d'), 'x.d.0')).toBe(false);
    // Past the look-ahead: LOOK_AHEAD of task e first, then two of task d.
    for (let i = 0; i < LOOK_AHEAD; i++) await add(`x.e.${i}`, digest('e'));
    await add('x.d.1', digest('d'));
    await add('x.d.2', digest('d'));
    expect(await upcoming.moreOf(digest('e'), 'x.e.0')).toBe(true);
    expect(await upcoming.moreOf(digest('d'), 'x.d.1')).toBe(false);
  });

  it('answers none waiting within its bound when Redis takes the question and never answers', async () => {
    // A loopback server that accepts and says nothing: every command waits for ever.
    const held: net.Socket[] = [];
    const silent = net.createServer((socket) => held.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const { port } = silent.address() as net.AddressInfo;
    const mute = new Redis({ host: '127.0.0.1', port, maxRetriesPerRequest: null, enableReadyCheck: false });
    const away = new Queue(EPISODES_QUEUE, { connection: mute, prefix: 'upcoming-test' });
    away.on('error', () => undefined);
    try {
      const asked = performance.now();
      expect(await new UpcomingTasks(away, silentLog, 0).moreOf(digest('a'), 'b.a.0')).toBe(false);
      expect(performance.now() - asked).toBeLessThan(READ_BOUND_MS + 1_000);
    } finally {
      mute.disconnect();
      for (const socket of held) socket.destroy();
      await new Promise<void>((resolve) => silent.close(() => resolve()));
    }
  });

  it('answers none waiting when the queue cannot be read', async () => {
    const broken = new Redis('redis://127.0.0.1:1', { maxRetriesPerRequest: 0, lazyConnect: true, retryStrategy: () => null });
    const away = new Queue(EPISODES_QUEUE, { connection: broken, prefix: 'upcoming-test' });
    away.on('error', () => undefined);
    try {
      expect(await new UpcomingTasks(away, silentLog).moreOf(digest('a'), 'b.a.0')).toBe(false);
    } finally {
      await away.close().catch(() => undefined);
      broken.disconnect();
    }
  });
});
