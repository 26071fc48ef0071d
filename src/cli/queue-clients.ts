// Queue clients for the producer-side commands (enqueue, cancel, retry, demo), apart from context.ts
// because BullMQ takes ~0.4 s to load and `status` and `results` do not need it.
import { FlowProducer, Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { EPISODES_QUEUE } from '../../queues/episodes/contract.ts';
import { dockerStatusOf, type Docker } from '../sandbox/docker-client.ts';

export function episodesQueue(redis: Redis, prefix: string): Queue {
  return new Queue(EPISODES_QUEUE, { connection: redis, prefix });
}

export function flowProducer(redis: Redis, prefix: string): FlowProducer {
  return new FlowProducer({ connection: redis, prefix });
}

/** Whether the engine has an image; undefined when the engine cannot be asked from here. */
export function imageChecker(docker: Docker) {
  return async (image: string): Promise<boolean | undefined> => {
    try {
      await docker.getImage(image).inspect();
      return true;
    } catch (err) {
      return dockerStatusOf(err) === 404 ? false : undefined;
    }
  };
}
