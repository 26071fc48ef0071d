// Resume: a retried llm episode continues from its latest durable checkpoint whose workspace was
// captured, restored into the sandbox before the agent starts. Runs under the set-up deadline.
import path from 'node:path';
import type { AgentInput } from '../agent/reference/agent-input.ts';
import type { Deadline } from '../deadlines/deadline.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { AttemptState, EpisodeAttempt, EpisodeDeps } from './episode-attempt.ts';

export type AgentResume = NonNullable<AgentInput['resume']>;

/**
 * The newest durable checkpoint whose workspace was captured, restored into the sandbox; undefined
 * when there is none (a conversation without its workspace would remember edits that are not there).
 */
export async function resumePoint(
  attempt: EpisodeAttempt,
  deps: EpisodeDeps,
  session: SandboxSession,
  state: AttemptState,
  deadline: Deadline,
): Promise<AgentResume | undefined> {
  const { job } = attempt;
  const { store } = deps.checkpoints;
  const seqs = (await deadline.run('listing checkpoints', () => store.seqs(job.episodeId))).sort((a, b) => b - a);
  for (const seq of seqs) {
    const stored = await deadline.run('reading a checkpoint', () => store.read(job.episodeId, seq));
    if (stored?.workspaceTar === undefined) {
      if (stored) deps.log.info({ seq, workspace: stored.checkpoint.workspace }, 'checkpoint without its workspace: not resumed from');
      continue;
    }
    const { checkpoint } = stored;
    const tar = stored.workspaceTar;
    // The tar holds the workdir under its base name (what getArchive gave): unpack it in the parent.
    await deadline.run('restoring the checkpoint workspace', (signal) => session.putArchive(tar.open(), path.posix.dirname(job.task.workdir), signal));
    state.resumedFrom = checkpoint.seq;
    deps.log.info({ seq: checkpoint.seq, turn: checkpoint.turn, agentMs: checkpoint.agentMs }, 'resuming from checkpoint');
    return { turn: checkpoint.turn, messages: checkpoint.messages, usage: checkpoint.usage, agentMs: checkpoint.agentMs };
  }
  return undefined;
}
