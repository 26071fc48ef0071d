// Results as CSV, one row per episode, for spreadsheets and pandas.
import type { EpisodeResult } from '../episode/episode-job.ts';

const COLUMNS: [string, (r: EpisodeResult) => unknown][] = [
  ['episode_id', (r) => r.episodeId],
  ['batch_id', (r) => r.batchId],
  ['task_id', (r) => r.taskId],
  ['sample', (r) => r.sample],
  ['status', (r) => r.status],
  ['error_kind', (r) => r.error?.kind],
  ['error_code', (r) => r.error?.code],
  ['reward', (r) => r.reward],
  ['attempts', (r) => r.attempts],
  ['worker_id', (r) => r.workerId],
  ['setup_ms', (r) => r.timings.setupMs],
  ['agent_ms', (r) => r.timings.agentMs],
  ['verify_ms', (r) => r.timings.verifyMs],
  ['close_ms', (r) => r.timings.closeMs],
  ['total_ms', (r) => r.timings.totalMs],
  ['total_tokens', (r) => r.usage?.totalTokens],
  ['task_digest', (r) => r.provenance.taskDigest],
  ['image_id', (r) => r.provenance.imageId],
  ['agent', (r) => r.provenance.agent.kind],
  ['error_message', (r) => r.error?.message],
  // The model the episode played and the policy versions its calls were stamped with (first, last).
  ['model_endpoint', (r) => r.model?.endpoint],
  ['model_name', (r) => r.model?.name],
  ['policy_first', (r) => r.policyVersions?.first],
  ['policy_last', (r) => r.policyVersions?.last],
  // A Harbor reward file's metrics as one JSON object ({"correctness":1,"performance":0.5}); last, so
  // the columns before it keep their places.
  ['metrics', (r) => (r.metrics ? JSON.stringify(r.metrics) : undefined)],
];

function cell(value: unknown): string {
  if (value === undefined || value === null) return '';
  const text = String(value);
  return /[",\n\r]/.test(text) ? `"${text.replace(/"/g, '""')}"` : text;
}

/** The header line, without its newline. */
export function csvHeader(): string {
  return COLUMNS.map(([name]) => name).join(',');
}

/** One result's row, without its newline. */
export function csvRow(r: EpisodeResult): string {
  return COLUMNS.map(([, get]) => cell(get(r))).join(',');
}

export function resultsCsv(results: readonly EpisodeResult[]): string {
  const rows = [csvHeader()];
  for (const r of results) rows.push(csvRow(r));
  return `${rows.join('\n')}\n`;
}
