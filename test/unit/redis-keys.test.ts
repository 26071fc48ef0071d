// The key formats are stored data: a worker of the next version must find what this one wrote. These
// literals are the formats as they were before the keys were gathered in one module; changing one
// needs a migration, not just an edit here.
import { describe, expect, it } from 'vitest';
import * as keys from '../../src/redis/redis-keys.ts';

describe('redis keys', () => {
  it('keep their stored formats byte for byte', () => {
    const p = 'rf';
    expect([
      keys.runtimeLastUsedKey(p),
      keys.runtimeLockKey(p, 'ENGINE:ID', 'gen1'),
      keys.taskArchiveKey(p, 'abc'),
      keys.leaseKey(p, 'w-1'),
      keys.leaseKey(p, '*'),
      keys.leaseMissingKey(p, 'w-1'),
      keys.reapedCountKey(p),
      keys.episodePhaseKey(p, 'b.t.0'),
      keys.episodeCancelKey(p, 'b.t.0'),
      keys.episodeCancelChannel(p),
      keys.episodeFailuresKey(p, 'b.t.0'),
      keys.episodeStartsKey(p, 'b.t.0'),
      keys.checkpointLockKey(p, 'b.t.0'),
      keys.checkpointStagedKeyPrefix(p),
      keys.checkpointStagedKey(p, 'b.t.0.cp3', '00ff'),
      keys.batchManifestKey(p, 'b'),
      keys.batchResultsKey(p, 'b'),
      keys.batchOutlinesKey(p, 'b'),
      keys.batchSummaryKey(p, 'b'),
      keys.batchesKey(p),
      keys.modelLimitsIndexKey(p),
      keys.modelLimitStateKey(p, '0123abcd4567'),
      keys.modelLimitLeasesKey(p, '0123abcd4567'),
      keys.modelLimitQueueKey(p, '0123abcd4567'),
      keys.modelLimitWaitersKey(p, '0123abcd4567'),
      keys.modelLimitTokensKey(p, '0123abcd4567'),
      keys.fleetKeyPattern(p),
      keys.bullmqJobKey(p, 'checkpoints', 'b.t.0.cp3'),
      keys.bullmqEventsKey(p, 'episodes'),
    ]).toEqual([
      'rf:runtime:last-used',
      'rf:runtime:lock:ENGINE:ID:gen1',
      'rf:task-archive:abc',
      'rf:lease:w-1',
      'rf:lease:*',
      'rf:lease-missing:w-1',
      'rf:reaped-sandboxes',
      'rf:episode:b.t.0:phase',
      'rf:episode:b.t.0:cancel',
      'rf:episode-cancel',
      'rf:episode:b.t.0:failures',
      'rf:episode:b.t.0:starts',
      'rf:checkpoint-lock:b.t.0',
      'rf:checkpoint-staged:',
      'rf:checkpoint-staged:b.t.0.cp3:00ff',
      'rf:batch:b',
      'rf:batch:b:results',
      'rf:batch:b:outlines',
      'rf:batch:b:summary',
      'rf:batches',
      'rf:model-limits',
      'rf:model-limit:0123abcd4567:state',
      'rf:model-limit:0123abcd4567:leases',
      'rf:model-limit:0123abcd4567:queue',
      'rf:model-limit:0123abcd4567:waiters',
      'rf:model-limit:0123abcd4567:tokens',
      'rf:*',
      'rf:checkpoints:b.t.0.cp3',
      'rf:episodes:events',
    ]);
  });
});
