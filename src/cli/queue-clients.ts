// Queue clients for the commands that need BullMQ (enqueue, cancel, retry, demo, dashboard), apart from context.ts
// because BullMQ takes ~0.4 s to load and `status` and `results` do not need it.
import { FlowProducer, Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { BATCHES_QUEUE } from '../results/batch-job.ts';
import { CHECKPOINTS_QUEUE } from '../checkpoints/checkpoint-job.ts';
import { CLEANUP_QUEUE } from '../cleanup/cleanup-job.ts';
import { EPISODES_QUEUE } from '../episode/episode-job.ts';
import { dockerStatusOf, type Docker } from '../sandbox/docker-client.ts';
import { isImageReference } from '../tasks/task-spec.ts';
import { imageOnSomeHost, readHostFacts, type WorkerFacts } from '../worker/host-facts.ts';

export function episodesQueue(redis: Redis, prefix: string): Queue {
  return new Queue(EPISODES_QUEUE, { connection: redis, prefix });
}

/** Every queue of the fleet (what the dashboard shows); `onError` gives each queue its error listener. */
export function fleetQueues(redis: Redis, prefix: string, onError: (queue: string) => (err: Error) => void): Queue[] {
  return [BATCHES_QUEUE, EPISODES_QUEUE, CHECKPOINTS_QUEUE, CLEANUP_QUEUE].map((name) => {
    const queue = new Queue(name, { connection: redis, prefix });
    queue.on('error', onError(name));
    return queue;
  });
}

export function flowProducer(redis: Redis, prefix: string): FlowProducer {
  return new FlowProducer({ connection: redis, prefix });
}

/**
 * Whether the engine has an image; undefined when the engine cannot be asked from here (or there is
 * none: the API asks only the live workers' facts). A name that is
 * not an image reference never reaches the engine (it would be a path of the request), and a 400 for
 * one that is means the engine cannot have it either.
 */
export function imageChecker(docker: Docker | undefined, fleet?: { redis: Redis; prefix: string }) {
  let facts: Promise<WorkerFacts[]> | undefined;
  return async (image: string): Promise<boolean | undefined> => {
    if (!isImageReference(image)) return false;
    // Live workers report their engines' images: a task runs only where its image is.
    if (fleet !== undefined) {
      facts ??= readHostFacts(fleet.redis, fleet.prefix).catch(() => []);
      const onSomeHost = imageOnSomeHost(await facts, image);
      if (onSomeHost !== undefined) return onSomeHost;
    }
    if (docker === undefined) return undefined;
    try {
      await docker.getImage(image).inspect();
      return true;
    } catch (err) {
      const status = dockerStatusOf(err);
      return status === 404 || status === 400 ? false : undefined;
    }
  };
}
