// `results --format trajectories`: one JSON document per episode a trainer can learn from, without
// parsing any agent's output: the task, status, reward (a float) and its metrics, the failure, the attempt and the checkpoint it
// resumed from, usage and timings, and the final attempt's trajectory (the conversation as OpenAI-style
// messages, per assistant turn its answer, usage and the token ids and logprobs the endpoint returned)
// read from the artifact store, so any host can export any host's episodes. null when the episode ran
// no model (a command agent without one, the oracle), or its attempt kept no trajectory.
import type { EpisodeResult } from '../episode/episode-job.ts';
import type { ArtifactStore } from '../artifacts/artifact-store.ts';
import { TRAJECTORY_FILE, type Trajectory } from '../evidence/trajectory.ts';

export interface TrajectoryRecord {
  episodeId: string;
  batchId: string;
  taskId: string;
  sample: number;
  status: EpisodeResult['status'];
  reward: number | null;
  /** The verifier's reward-file metrics (reward.json's keys), when it graded by a reward file. */
  metrics?: Record<string, number>;
  error?: EpisodeResult['error'];
  attempts: number;
  resumedFrom?: number;
  usage?: EpisodeResult['usage'];
  timings: EpisodeResult['timings'];
  /** The policy versions its conversation's calls were stamped with (each turn has its own `policyVersion`). */
  policyVersions?: EpisodeResult['policyVersions'];
  /** Restarts from scratch for growing staler than the batch's maxStaleness. */
  staleRestarts?: number;
  /** The final attempt's trajectory, or null. */
  trajectory: Trajectory | null;
}

const MAX_TRAJECTORY_BYTES = 256 * 1024 * 1024;

/** The newest attempt's trajectory of an episode in the store, or null. */
async function latestTrajectory(store: ArtifactStore, episodeId: string, signal: AbortSignal): Promise<Trajectory | null> {
  const base = `evidence/${episodeId}/`;
  const attempts = (await store.list(base, { signal }))
    .map((o) => /^attempt-(\d+)\/trajectory\.json$/.exec(o.key.slice(base.length)))
    .filter((m): m is RegExpExecArray => m !== null)
    .map((m) => Number(m[1]))
    .sort((a, b) => b - a);
  if (attempts.length === 0) return null;
  const bytes = await store.get(`${base}attempt-${attempts[0]}/${TRAJECTORY_FILE}`, { signal, maxBytes: MAX_TRAJECTORY_BYTES });
  return bytes === undefined ? null : (JSON.parse(Buffer.from(bytes).toString('utf8')) as Trajectory);
}

export async function* trajectoryRecords(results: readonly EpisodeResult[], store: ArtifactStore, signal: AbortSignal): AsyncGenerator<TrajectoryRecord> {
  for (const r of results) {
    yield {
      episodeId: r.episodeId,
      batchId: r.batchId,
      taskId: r.taskId,
      sample: r.sample,
      status: r.status,
      reward: r.reward,
      ...(r.metrics && { metrics: r.metrics }),
      ...(r.error && { error: r.error }),
      attempts: r.attempts,
      ...(r.resumedFrom !== undefined && { resumedFrom: r.resumedFrom }),
      ...(r.usage && { usage: r.usage }),
      timings: r.timings,
      ...(r.policyVersions && { policyVersions: r.policyVersions }),
      ...(r.staleRestarts !== undefined && { staleRestarts: r.staleRestarts }),
      trajectory: await latestTrajectory(store, r.episodeId, signal),
    };
  }
}
