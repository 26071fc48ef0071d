// Every Redis key (and the one pub/sub channel) the fleet itself names, built in one place so the
// keyspace can be read at a glance. All of them start with the fleet prefix (FLEET_PREFIX), which
// BullMQ also uses for its queues, so several fleets can share one Redis. The values are stored data:
// changing a format here strands what Redis already holds, so a change needs a migration.
// Imports nothing of the fleet: every layer, queue contracts and tests included, may use it.

// --- runtime generations ---

/** Hash: generation id -> when a sandbox last mounted it (ms since the epoch), for the stale-generation sweep. */
export const runtimeLastUsedKey = (prefix: string) => `${prefix}:runtime:last-used`;

/** Token lock: one per engine and generation, so hosts sharing a Redis install their own engines in parallel. */
export const runtimeLockKey = (prefix: string, engineId: string, generationId: string) => `${prefix}:runtime:lock:${engineId}:${generationId}`;

// --- task environments (images built from a task's environment/) ---

/** Token lock: one per engine and environment digest, so one build per engine at a time. */
export const envBuildLockKey = (prefix: string, engineId: string, digest: string) => `${prefix}:env:lock:${engineId}:${digest}`;

/** String with a TTL: a failed build of this digest on this engine (JSON: message and log), so it is not rebuilt per sample. */
export const envBuildFailureKey = (prefix: string, engineId: string, digest: string) => `${prefix}:env:failed:${engineId}:${digest}`;

/** Hash: image tag -> when an episode last asked for it on this engine (ms since the epoch), for pruning least recently used. */
export const envLastUsedKey = (prefix: string, engineId: string) => `${prefix}:env:last-used:${engineId}`;

/** String with a TTL of the prune interval: this engine's environment images were pruned within it (one run per engine and interval, however many workers it has). */
export const envPruneRanKey = (prefix: string, engineId: string) => `${prefix}:env:pruned:${engineId}`;

// --- tasks ---

/** String: a packed task folder (tar bytes), named by its sha256. */
export const taskArchiveKey = (prefix: string, digest: string) => `${prefix}:task-archive:${digest}`;

// --- workers and the reaper ---

/** String with a TTL: a worker's lease; pass `*` as the id for a SCAN pattern of every lease. */
export const leaseKey = (prefix: string, workerId: string) => `${prefix}:lease:${workerId}`;

/** String: when the reaper first saw this worker's lease missing (ms since the epoch). */
export const leaseMissingKey = (prefix: string, workerId: string) => `${prefix}:lease-missing:${workerId}`;

/** Counter: every sandbox the reaper removed (for /metrics). */
export const reapedCountKey = (prefix: string) => `${prefix}:reaped-sandboxes`;

/** Hash: engine id -> the reaper's last run on that engine (JSON: when, what it found and removed), for the dashboard. */
export const reaperLastRunKey = (prefix: string) => `${prefix}:reaper:last-run`;

// --- episodes ---

/** String: the phase of the running attempt (`running`, `closing`). */
export const episodePhaseKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:phase`;

/** String: a cancel was requested. */
export const episodeCancelKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:cancel`;

/** Pub/sub channel: episode ids whose cancel was requested, for whichever worker runs them. */
export const episodeCancelChannel = (prefix: string) => `${prefix}:episode-cancel`;

/** Hash: failure kind -> failed attempts of that kind (each kind has its own retry budget). */
export const episodeFailuresKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:failures`;

/** Counter: attempts started, across retries, stalls, drains and requeues (numbers each attempt's evidence). */
export const episodeStartsKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:starts`;

/** String: a retry by kind was requested; the episode's recorded result is superseded once its job runs again. */
export const episodeRetryKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:retry`;

/** Hash with a TTL: a multi-step episode's progress at its last step boundary (`done`: JSON of the graded steps; `workdir`: tar of the workdir then), so a retry resumes at the next step. */
export const episodeStepsKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:steps`;

// --- policy versions (src/model/policy-versions.ts) ---

/** Hash (`version`, `setAt`): the current policy version of a model endpoint, set by the trainer; only moves forward. */
export const policyVersionKey = (prefix: string, endpoint: string) => `${prefix}:policy-version:${endpoint}`;

/** Hash with a TTL: the policy versions an episode's conversation saw (`first`, `last`, `v:<version>` -> calls), reset when it starts afresh. */
export const episodePolicyVersionsKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:policy-versions`;

/** Hash with a TTL: `restarts` (stale restarts so far), `restartedAt` (ms since the epoch of the last one: older checkpoints are not resumed from). */
export const episodeStaleKey = (prefix: string, episodeId: string) => `${prefix}:episode:${episodeId}:stale`;

// --- checkpoints ---

/** Token lock: the critical section of one episode's checkpoint write. */
export const checkpointLockKey = (prefix: string, episodeId: string) => `${prefix}:checkpoint-lock:${episodeId}`;

/** What every staged checkpoint's key starts with (the writer refuses a job naming any other key). */
export const checkpointStagedKeyPrefix = (prefix: string) => `${prefix}:checkpoint-staged:`;

/** Hash: one checkpoint between sink and writer; `nonce` keeps two hand-offs of one job apart. */
export const checkpointStagedKey = (prefix: string, jobId: string, nonce: string) => `${checkpointStagedKeyPrefix(prefix)}${jobId}:${nonce}`;

// --- batches and results ---

/** String: a batch's manifest (JSON). */
export const batchManifestKey = (prefix: string, batchId: string) => `${prefix}:batch:${batchId}`;

/** Hash: episode id -> its result (JSON). */
export const batchResultsKey = (prefix: string, batchId: string) => `${prefix}:batch:${batchId}:results`;

/**
 * Stream: the batch's results in completion order, one entry (`episodeId`, `status`, `reward`) per
 * recorded result, added atomically with it; its entry ids are the cursors of a result stream.
 */
export const batchCompletionsKey = (prefix: string, batchId: string) => `${prefix}:batch:${batchId}:completions`;

/**
 * Hash: episode id -> the outline of its result (a JSON array: what the summary and the batch page
 * read, see results-store.ts), written and removed with the result in the same step.
 */
export const batchOutlinesKey = (prefix: string, batchId: string) => `${prefix}:batch:${batchId}:outlines`;

/** Counter: bumped in the same step as every change of the batch's results (one recorded, one forgotten). */
export const batchResultsVersionKey = (prefix: string, batchId: string) => `${prefix}:batch:${batchId}:version`;

/**
 * String: the summary last computed, with the results version and count it was computed at (JSON
 * `{version, results, summary}`); it is the batch's summary while both are still those.
 */
export const batchSummaryCacheKey = (prefix: string, batchId: string) => `${prefix}:batch:${batchId}:summary-cache`;

/** String: the batch summary, stored once its last episode ended. */
export const batchSummaryKey = (prefix: string, batchId: string) => `${prefix}:batch:${batchId}:summary`;

/** Sorted set: every batch id, scored by its creation time, so the dashboard lists batches without a SCAN. */
export const batchesKey = (prefix: string) => `${prefix}:batches`;

// --- model endpoint limits (fleet-limits.ts) ---
// One set per model endpoint, named by a short sha256 of its base URL without credentials. Each script
// that touches them renews their TTL, so a retired endpoint's keys expire by themselves.

/** Sorted set: endpoint id -> when it was last used (Redis time, ms); the dashboard lists endpoints from it. */
export const modelLimitsIndexKey = (prefix: string) => `${prefix}:model-limits`;

/** Hash: an endpoint's shared limiter state (GCRA arrival time, allowance factor, pause, token allowance, counters, host). */
export const modelLimitStateKey = (prefix: string, endpointId: string) => `${prefix}:model-limit:${endpointId}:state`;

/** Sorted set: concurrency leases, lease id -> expiry (Redis time, ms); an expired lease is a dead holder's. */
export const modelLimitLeasesKey = (prefix: string, endpointId: string) => `${prefix}:model-limit:${endpointId}:leases`;

/** Sorted set: waiters in arrival order, waiter id -> first arrival (Redis time, ms), for first-come turns. */
export const modelLimitQueueKey = (prefix: string, endpointId: string) => `${prefix}:model-limit:${endpointId}:queue`;

/** Sorted set: waiter id -> when it counts as gone unless it asks again (Redis time, ms). */
export const modelLimitWaitersKey = (prefix: string, endpointId: string) => `${prefix}:model-limit:${endpointId}:waiters`;

/** Hash: second (Redis time, s) -> tokens charged in it, for the tokens of the last minute. */
export const modelLimitTokensKey = (prefix: string, endpointId: string) => `${prefix}:model-limit:${endpointId}:tokens`;

// --- whole keyspace ---

/** SCAN/KEYS pattern of every key of this fleet, BullMQ's included. */
export const fleetKeyPattern = (prefix: string) => `${prefix}:*`;

/** BullMQ's own key of a job (its hash), as `Queue.toKey(jobId)` builds it; for tools and tests that read Redis directly. */
export const bullmqJobKey = (prefix: string, queueName: string, jobId: string) => `${prefix}:${queueName}:${jobId}`;

/** BullMQ's event stream of a queue (what QueueEvents reads); for tests that must see an event in the same tick. */
export const bullmqEventsKey = (prefix: string, queueName: string) => `${prefix}:${queueName}:events`;

// --- checkpoints in an object store ---

/** String: the newest durable checkpoint seq of an episode whose checkpoints are in an object store (only ever raised). */
export const checkpointLatestKey = (prefix: string, episodeId: string) => `${prefix}:checkpoint-latest:${episodeId}`;

/** String: the episode has its result; a checkpoint written after this is removed again (the fence). */
export const checkpointFenceKey = (prefix: string, episodeId: string) => `${prefix}:checkpoint-fence:${episodeId}`;

// --- hosts ---

/** String with a TTL: one worker's facts (host, engine, runtime generation, images, free disk); `*` for a SCAN pattern. */
export const workerFactsKey = (prefix: string, workerId: string) => `${prefix}:worker-facts:${workerId}`;

// --- the warm sandbox pool ---

/** String (JSON `{episodeId, batchId, attempt}`) with a TTL: the episode that claimed a pooled sandbox, for the reaper. */
export const sandboxClaimKey = (prefix: string, containerId: string) => `${prefix}:sandbox-claim:${containerId}`;

/** String: the manifest digest (sha256:...) an environment of this content digest was pushed as to this registry (FLEET_REGISTRY), for other hosts to pull by. */
export const envRegistryDigestKey = (prefix: string, registry: string, digest: string) => `${prefix}:env:pushed:${registry}:${digest}`;
