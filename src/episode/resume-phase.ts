// Resume: a retried llm episode continues from its latest durable checkpoint whose workspace was
// captured, restored into the sandbox before the agent starts. Runs under the set-up deadline and
// returns what the agent resumes with and which checkpoint that was.
import path from 'node:path';
import type { AgentInput } from '../agent/reference/agent-input.ts';
import type { StoredCheckpoint } from '../checkpoints/checkpoint-storage.ts';
import { untilAborted, type Deadline } from '../deadlines/deadline.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import { staleRestarts } from '../model/policy-versions.ts';
import type { EpisodeAttempt, EpisodeDeps } from './episode-attempt.ts';

export type AgentResume = NonNullable<AgentInput['resume']>;

/** The checkpoint restored, and what the agent resumes with. */
export interface Resumed {
  /** The checkpoint's sequence number (the result's resumedFrom). */
  seq: number;
  agent: AgentResume;
}

/** What resume uses of the worker's clients and stores. */
export type ResumeDeps = Pick<EpisodeDeps, 'checkpoints' | 'log'> & Partial<Pick<EpisodeDeps, 'redis' | 'prefix'>>;

/**
 * The newest durable checkpoint whose workspace was captured, restored into the sandbox; undefined
 * when there is none (a conversation without its workspace would remember edits that are not there).
 */
export async function resumePoint(
  attempt: EpisodeAttempt,
  deps: ResumeDeps,
  session: SandboxSession,
  deadline: Deadline,
): Promise<Resumed | undefined> {
  const { job } = attempt;
  // A first attempt has no checkpoints to find: no store call on its critical path.
  if (attempt.attempt === 1) return undefined;
  // Looking the checkpoints up is best effort: a store that is down or slow (an S3 artifact store) must
  // not fail the attempt. It gets half of what is left of the set-up reserve; past that, or on a store
  // error, the attempt starts afresh. A stop from outside or the set-up deadline itself still ends it.
  const lookup = deadline.within(Math.round(deadline.remainingMs / 2), 'looking up checkpoints');
  let stored: StoredCheckpoint | undefined;
  try {
    stored = await untilAborted((async () => {
      // A stale restart started the episode from scratch: checkpoints of the conversation it dropped are not resumed from.
      const notBefore = deps.redis !== undefined && deps.prefix !== undefined ? (await staleRestarts(deps.redis, deps.prefix, job.episodeId)).restartedAt : undefined;
      return newestWithWorkspace(job.episodeId, deps, notBefore);
    })(), lookup);
  } catch (err) {
    if (deadline.signal.aborted) throw deadline.signal.reason;
    deps.log.warn({ err: String(err) }, 'checkpoints could not be looked up; the attempt starts afresh');
    return undefined;
  }
  if (stored?.workspaceTar === undefined) return undefined;
  const { checkpoint } = stored;
  const tar = stored.workspaceTar;
  // The tar holds the workdir under its base name (what getArchive gave): unpack it in the parent.
  await deadline.run('restoring the checkpoint workspace', (signal) => session.putArchive(tar.open(), path.posix.dirname(job.task.workdir), signal));
  deps.log.info({ seq: checkpoint.seq, turn: checkpoint.turn, agentMs: checkpoint.agentMs }, 'resuming from checkpoint');
  return { seq: checkpoint.seq, agent: { turn: checkpoint.turn, messages: checkpoint.messages, usage: checkpoint.usage, agentMs: checkpoint.agentMs } };
}

/** The newest durable checkpoint of the episode whose workspace was captured, or undefined. */
async function newestWithWorkspace(episodeId: string, deps: ResumeDeps, notBefore: number | undefined): Promise<StoredCheckpoint | undefined> {
  const { store } = deps.checkpoints;
  const seqs = (await store.seqs(episodeId)).sort((a, b) => b - a);
  for (const seq of seqs) {
    const stored = await store.read(episodeId, seq);
    if (stored && notBefore !== undefined && Date.parse(stored.checkpoint.createdAt) < notBefore) {
      deps.log.info({ seq }, 'checkpoint from before a stale restart: not resumed from');
      continue;
    }
    if (stored?.workspaceTar !== undefined) return stored;
    if (stored) deps.log.info({ seq, workspace: stored.checkpoint.workspace }, 'checkpoint without its workspace: not resumed from');
  }
  return undefined;
}
