// An episode's failed attempts per kind, kept in Redis by the episodes processor and compared with
// each kind's retry budget. Here for the producer side, which must not load the processor (and with
// it the whole episode runner and dockerode) to requeue an episode.
import type { Redis } from 'ioredis';
import { episodeFailuresKey } from '../redis/redis-keys.ts';

/** Forget an episode's retry counts (it is requeued, e.g. retried by kind: fresh budgets). */
export async function resetRetryCounts(redis: Redis, prefix: string, episodeId: string): Promise<void> {
  await redis.del(episodeFailuresKey(prefix, episodeId));
}
