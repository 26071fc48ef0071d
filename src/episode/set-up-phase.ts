// Set-up: fetch the task archive, prepare the runtime generation, start the model proxy (agents that
// need a model), seed the episode's ONE sandbox session and copy the workspace in. Every step runs
// under the set-up deadline, so a stalled Redis, engine or file system ends the phase at its reserve.
import { createHash } from 'node:crypto';
import { rm } from 'node:fs/promises';
import path from 'node:path';
import type { Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy, type ModelProxy } from '../model/model-proxy.ts';
import { SANDBOX_USER, SandboxSession } from '../sandbox/sandbox-session.ts';
import { agentUsesModel } from '../tasks/agent-spec.ts';
import { getTaskArchive } from '../tasks/task-store.ts';
import type { AttemptState, EpisodeAttempt, EpisodeDeps } from './episode-attempt.ts';

export async function setUp(attempt: EpisodeAttempt, deps: EpisodeDeps, state: AttemptState, deadline: Deadline): Promise<SandboxSession> {
  const { job } = attempt;
  const { task } = job;
  const log = deps.log;
  const archive = await deadline.run('fetching the task archive from Redis', () => getTaskArchive(deps.redis, deps.prefix, job.taskDigest));
  state.archive = archive;
  const runtime = await deadline.run('preparing the runtime generation', (signal) => deps.prepareRuntime(signal));
  state.runtime = runtime;
  if (agentUsesModel(job.agent, deps.model !== undefined)) {
    // A proxy that starts after the deadline is closed at once: nothing would ever close it otherwise.
    state.proxy = await deadline.run('starting the model proxy', () => startEpisodeProxy(attempt, deps), (late) => {
      late.close()
        .then(() => rm(path.dirname(late.socketPath), { recursive: true, force: true }))
        .catch((err: unknown) => log.warn({ err: String(err) }, 'closing a model proxy that started too late failed'));
    });
  }
  const session = await deadline.run('creating the sandbox', (signal) => SandboxSession.open(
    { docker: deps.docker, log, callTimeoutMs: deps.callTimeoutMs },
    {
      image: task.image,
      workdir: task.workdir,
      limits: task.limits,
      owner: { fleet: deps.prefix, episodeId: job.episodeId, batchId: job.batchId, workerId: deps.workerId, attempt: attempt.attempt },
      mounts: [runtime.mount],
      bindFolders: state.proxy ? [path.dirname(state.proxy.socketPath)] : [],
    },
    // Registered as soon as the container exists, so close removes it even if set-up goes no further.
    (id) => {
      state.containerId = id;
    },
    signal,
  // A session that opens after the deadline is nobody's: stop its event stream (close removes the container by id).
  ), (late) => late.stopWatching());
  state.session = session;
  state.imageId = session.imageId;
  const workspace = await archive.partAsTar('workspace', task.workdir, SANDBOX_USER);
  await deadline.run('copying the workspace in', (signal) => session.putArchive(workspace, '/', signal));
  return session;
}

/** The episode's model proxy: the sandbox's one way out, to the configured endpoint only. */
async function startEpisodeProxy(attempt: EpisodeAttempt, deps: EpisodeDeps): Promise<ModelProxy> {
  const { job } = attempt;
  if (deps.model === undefined) {
    throw new FleetError('model_error', `agent ${job.agent.kind} needs a model, and MODEL_BASE_URL is not set on worker ${deps.workerId}`);
  }
  // A short folder name: a Unix socket path must stay under 108 bytes.
  const folderId = createHash('sha256').update(`${job.episodeId}/${attempt.attempt}`).digest('hex').slice(0, 16);
  return startModelProxy({
    socketPath: modelSocketPath(deps.dataDir, folderId),
    upstreamBaseUrl: deps.model.baseUrl,
    apiKey: deps.model.apiKey,
    model: deps.model.name,
    budget: { maxCalls: deps.model.maxCalls, maxTokens: deps.model.maxTokens },
    evidenceFile: path.join(deps.evidence.folder(job.episodeId, attempt.attempt), MODEL_CALLS_FILE),
    episodeId: job.episodeId,
    taskId: job.task.id,
    log: deps.log,
    requestTimeoutMs: deps.model.requestTimeoutMs,
    retry: { retries: deps.model.upstreamRetries },
    captureTokens: job.model?.capture === 'tokens',
    ...(deps.model.limiter && { limiter: deps.model.limiter }),
  });
}
