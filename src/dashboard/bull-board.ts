// Bull Board over every queue of the fleet, read-only unless write actions are enabled (Bull Board
// then refuses every write with 405 on the server, not only in the UI), with job data and return
// values shown through the secret redactor.
import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { ExpressAdapter } from '@bull-board/express';
import type { Queue } from 'bullmq';
import type { Router } from 'express';
import { redactSecrets } from './redact.ts';

export interface BullBoardOptions {
  queues: readonly Queue[];
  /** Where the router is mounted, e.g. /queues. */
  basePath: string;
  /** Allow retries, cleaning, pausing, adding and editing jobs. */
  writeEnabled: boolean;
  descriptions?: Record<string, string>;
  /** Per queue: a link shown on each job's page, made from the job's data. */
  jobLinks?: Record<string, (data: unknown) => { displayText: string; href: string }>;
}

export function bullBoardRouter(opts: BullBoardOptions): Router {
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath(opts.basePath);
  const adapters = opts.queues.map((queue) => {
    const jobLink = opts.jobLinks?.[queue.name];
    const adapter = new BullMQAdapter(queue, {
      readOnlyMode: !opts.writeEnabled,
      allowRetries: opts.writeEnabled,
      description: opts.descriptions?.[queue.name] ?? '',
      ...(jobLink && { externalJobUrl: (job: { data: unknown }) => jobLink(job.data) }),
    });
    adapter.setFormatter('data', redactSecrets);
    adapter.setFormatter('returnValue', redactSecrets);
    return adapter;
  });
  createBullBoard({
    queues: adapters,
    serverAdapter,
    options: {
      uiConfig: {
        boardTitle: 'rollout-fleet',
        miscLinks: [{ text: 'Batches', url: '/batches' }, { text: 'Metrics', url: '/metrics' }],
      },
    },
  });
  return serverAdapter.getRouter() as Router;
}
