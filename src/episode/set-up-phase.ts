// Set-up: fetch the task archive, prepare the runtime generation, claim a warm sandbox of the worker's
// pool (or, when none is ready, create the episode's own), start the model proxy (agents that need a
// model), and copy the workspace into the episode's ONE sandbox session. Every step runs
// under the set-up deadline, so a stalled Redis, engine or file system ends the phase at its reserve.
// Returns what it made; each part is also left in the attempt's trail (the sandbox's in its lease) as
// soon as it exists, so close ends it even when set-up goes no further.
import { createHash } from 'node:crypto';
import { chmod, mkdir, rm } from 'node:fs/promises';
import path from 'node:path';
import type { Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { MODEL_CALLS_FILE, modelSocketPath, startModelProxy, type ModelProxy } from '../model/model-proxy.ts';
import { removeEnvironment } from '../sandbox/environment-lease.ts';
import { SANDBOX_USER, SandboxSession } from '../sandbox/sandbox-session.ts';
import { harborKeepAlive } from '../sandbox/container-spec.ts';
import type { Claimed, PoolSpec } from '../sandbox/sandbox-pool.ts';
import { agentUsesModel } from '../tasks/agent-spec.ts';
import { getTaskArchive } from '../tasks/task-store.ts';
import type { TaskArchive } from '../tasks/task-archive.ts';
import type { HarborRun, HarborServices, TaskSpec } from '../tasks/task-spec.ts';
import { effectiveWorkdir, resolveServiceImages, resolveTaskImage, resolveVerifierImage } from '../environments/task-environment.ts';
import { startTaskServices, type ServiceNetwork } from '../sandbox/task-services.ts';
import type { SandboxOwner } from '../sandbox/labels.ts';
import type { VolumeMount } from '../sandbox/container-spec.ts';
import { harborLogsTar, runHealthcheck } from './harbor-checks.ts';
import { userFoldersTar } from './verify-phase.ts';
import { hasEgress } from '../egress/network-grant.ts';
import { phaseGrants } from './phase-egress.ts';
import type { AttemptTrail, EpisodeAttempt, EpisodeDeps, SetUpResult, WorkerEndpoint } from './episode-attempt.ts';
import { DEFAULT_ENDPOINT } from '../config/model-endpoints.ts';

/** What set-up uses of the worker's clients and stores. */
export type SetUpDeps = Pick<EpisodeDeps, 'docker' | 'redis' | 'prefix' | 'log' | 'workerId' | 'evidence' | 'callTimeoutMs' | 'prepareRuntime' | 'dataDir' | 'model' | 'pool' | 'upcoming' | 'sandboxRuntime' | 'policy' | 'network' | 'registry'>;

const ROOT = { uid: 0, gid: 0 } as const;
/** A command agent's sandboxes are seeded with its task's workspace from this size of its tar on (docs/USAGE.md, the warm sandbox pool). */
export const SEED_COMMAND_MIN_BYTES = 1024 * 1024;

export async function setUp(
  attempt: EpisodeAttempt,
  deps: SetUpDeps,
  trail: Pick<AttemptTrail, 'lease' | 'setUp'>,
  deadline: Deadline,
): Promise<SetUpResult> {
  const { job } = attempt;
  const log = deps.log;
  const { lease } = trail;
  const made = trail.setUp;
  // Before anything is fetched or created: a worker without the batch's endpoint runs nothing of it.
  const endpoint = episodeEndpoint(job, deps);
  const archive = await deadline.run('fetching the task archive from Redis', () => getTaskArchive(deps.redis, deps.prefix, job.taskDigest));
  made.archive = archive;
  // The runtime generation, and beside it a Harbor task's image: its docker_image when the engine has
  // it, else its environment/ built here (once per engine and content; the episode says it waits for
  // the build meanwhile). Side by side: a worker's first preparation (hashing the runtime, a probe
  // container) no longer adds to a fresh environment's build.
  const [runtime, image] = await deadline.run('preparing the runtime generation and the environment image', (signal) => Promise.all([
    deps.prepareRuntime(signal).then((r) => (made.runtime = r)),
    resolveTaskImage(deps, job.task, archive, { signal, onBuildWait: () => attempt.onPhase?.('build') }),
  ]));
  // A separate verifier's image (Harbor's separate mode) is ready before the agent starts, so a build never eats the verification reserve.
  const verifierImage = await deadline.run('preparing the verifier image', (signal) => resolveVerifierImage(deps, job.task, archive, image, {
    signal,
    onBuildWait: () => attempt.onPhase?.('build'),
  }));
  attempt.onPhase?.('setup');
  made.image = image;
  made.verifierImage = verifierImage;
  const task: TaskSpec = { ...job.task, image: image.image, workdir: effectiveWorkdir(job.task, image) };
  made.task = task;
  const owner = { fleet: deps.prefix, episodeId: job.episodeId, batchId: job.batchId, workerId: deps.workerId, attempt: attempt.attempt };
  // The sandbox as this episode creates it; a warm one of the pool matches all of it. A Harbor task's
  // keeps its image's ENTRYPOINT and USER, with its environment, and /logs written before its start;
  // its environment upload and healthcheck run here, after any claim, for this episode.
  const harborSpec = task.harbor && { env: task.harbor.env, user: task.harbor.agentUser, keepAlive: harborKeepAlive(runtime.mountPath) };
  const common = { image: task.image, workdir: task.workdir, limits: task.limits, mounts: [runtime.mount] };
  // The folders every sandbox of the kind starts with are part of the image it is created from
  // (prepared once per engine: no put per sandbox): a Harbor task's /logs; our own tasks' /tests (where
  // the end of the agent's turn unpacks the tests) and the empty workdir. In a sandbox of that kind a
  // command agent's exec unpacks the workspace itself (another agent gets a put). The workspace is never
  // part of an image: a folder of a lower layer cannot be renamed (overlayfs says EXDEV), and an agent's
  // `mv` must work in every sample alike. A kind seeded with the task's workspace gets it written
  // before its start, in the pool while more of the task wait (a GRPO group), and when set-up creates
  // the sandbox for another agent than a command.
  const poolSpec: PoolSpec = { ...common, ...(harborSpec ? { harbor: harborSpec, filesInImage: await harborLogsTar() } : { filesInImage: await userFoldersTar(task.workdir) }) };
  const workspaceTar = harborSpec ? undefined : await archive.partAsTar('workspace', task.workdir, SANDBOX_USER);
  const seededSpec: PoolSpec | undefined = workspaceTar && { ...poolSpec, filesBeforeStart: workspaceTar };
  // A warm sandbox of the worker's pool when one of this kind is ready: no create or start to wait for.
  const pool = deps.pool;
  // A miss fills the kind once this set-up is done with the engine too: a warm sandbox made beside this
  // episode's own create and start slowed them (406 and 437 ms for a fresh image's first, load 16).
  let endSetUp = () => {};
  const setUpDone = new Promise<void>((resolve) => (endSetUp = resolve));
  let claimed: Claimed | undefined;
  /** Whether the sandbox holds the workspace already (seeded, or written before its start here). */
  let seeded = false;
  // The pool refills once this set-up is done with the engine (or failed).
  try {
    // (Not a task with services: its sandbox joins the episode's namespace, made for it alone.)
    if (pool?.enabled && task.harbor?.services === undefined) {
      claimed = await deadline.run('claiming a warm sandbox', async (signal) => {
        // A GRPO group runs one task k times: while more of this task wait in the queue, the pool keeps
        // sandboxes seeded with its workspace (their own kind), else the kind for any task of the image.
        // A command agent's exec unpacks a small workspace itself in a few ms: seeding would cost each
        // sandbox a put (~50 ms of the engine's CPU) to save them, so only a big one is seeded for it.
        const seedable = workspaceTar !== undefined && (job.agent.kind !== 'command' || workspaceTar.length >= SEED_COMMAND_MIN_BYTES);
        const more = seedable && deps.upcoming !== undefined && await deps.upcoming.moreOf(job.taskDigest, job.episodeId);
        const fromSeeded = seedable && seededSpec && await pool.claim(seededSpec, owner, signal, setUpDone, { fill: more, seeded: true });
        if (fromSeeded) {
          seeded = true;
          // The task's last one coming: its place goes back to the kind for any task.
          if (!more) pool.prefill(poolSpec, setUpDone);
          return fromSeeded;
        }
        return pool.claim(poolSpec, owner, signal, setUpDone, { fill: !more });
      }, (late) => {
        if (late === undefined) return;
        late.refill();
        void removeEnvironment(deps.docker, late.session.containerId, deps.callTimeoutMs).catch(() => undefined);
      });
    }
    if (claimed !== undefined) lease.attach(claimed.session, { folder: claimed.folder, seeded });
    let proxy: ModelProxy | undefined;
    // A phase with network (allowlist, public) reaches the egress proxy through a socket in the run
    // folder: it must be mounted from the start, though the socket exists only while that phase runs.
    const grants = phaseGrants(task, deps.network);
    const egress = grants !== undefined && (hasEgress(grants.agent) || hasEgress(grants.verifier));
    let runFolder: string | undefined;
    if (egress) {
      runFolder = claimed ? claimed.folder : path.dirname(episodeSocketPath(attempt, deps));
      lease.useFolder(runFolder);
      made.runFolder = runFolder;
      const folder = runFolder;
      await deadline.run('making the run folder', async () => {
        await mkdir(folder, { recursive: true, mode: 0o755 });
        await chmod(folder, 0o755);
      });
    }
    if (endpoint !== undefined) {
      // In a claimed sandbox, the socket goes into the folder it was created with (a bind mount cannot be added).
      const socketPath = claimed ? path.join(claimed.folder, 'model.sock') : episodeSocketPath(attempt, deps);
      lease.useFolder(path.dirname(socketPath));
      // A proxy that starts after the deadline is closed at once: nothing would ever close it otherwise.
      proxy = await deadline.run('starting the model proxy', () => startEpisodeProxy(attempt, deps, endpoint, socketPath), (late) => {
        late.close()
          .then(() => rm(path.dirname(late.socketPath), { recursive: true, force: true }))
          .catch((err: unknown) => log.warn({ err: String(err) }, 'closing a model proxy that started too late failed'));
      });
      made.proxy = proxy;
    }
    // Task services: their images, the episode's namespace, volumes and sidecars, and what main waits for.
    const services = task.harbor?.services;
    const serviceNetwork = services && await startServices(task, services, archive, runtime.mount, owner, deps, attempt, lease, deadline);
    const createSpec = seededSpec !== undefined && job.agent.kind !== 'command' ? seededSpec : poolSpec;
    if (claimed === undefined && createSpec === seededSpec) seeded = true;
    const session = claimed?.session ?? await deadline.run('creating the sandbox', (signal) => SandboxSession.open(
      { docker: deps.docker, log, callTimeoutMs: deps.callTimeoutMs },
      {
        ...createSpec, owner, bindFolders: proxy ? [path.dirname(proxy.socketPath)] : runFolder !== undefined ? [runFolder] : [], runtime: deps.sandboxRuntime,
        // [environment].env over main's environment of the compose file, as Harbor's env override.
        ...(services && poolSpec.harbor && { harbor: { ...poolSpec.harbor, env: { ...services.main.env, ...poolSpec.harbor.env } } }),
        ...(serviceNetwork && { services: serviceNetwork }),
      },
      // Registered as soon as the container exists, so close removes it even if set-up goes no further.
      (id) => lease.registerContainer(id),
      signal,
    // A session that opens after the deadline is nobody's: stop its event stream (close removes the container by id).
    ), (late) => late.stopWatching());
    if (claimed === undefined) lease.attach(session);
    const { imageId } = session;
    made.imageId = imageId;
    let workspaceIn: Buffer | undefined;
    if (task.harbor) await prepareHarborSandbox(task, task.harbor, archive, session, deadline);
    else if (!seeded && workspaceTar !== undefined) {
      // A command agent's own exec unpacks it first (src/agent/command-agent.ts): one engine call fewer.
      if (job.agent.kind === 'command') workspaceIn = workspaceTar;
      else await deadline.run('copying the workspace in', (signal) => session.putArchive(workspaceTar, '/', signal));
    }
    return { archive, runtime, session, proxy, imageId, image, verifierImage, services: serviceNetwork, task, ...(runFolder !== undefined && { runFolder }), ...(workspaceIn && { workspaceIn }) };
  } finally {
    claimed?.refill();
    endSetUp();
  }
}

/**
 * A Harbor task's sandbox as Harbor leaves it for the agent: /logs/agent, /logs/verifier and
 * /logs/artifacts writable by the agent's user, environment/'s files in the workdir when the task
 * has only a docker_image, and its healthcheck passed.
 */
async function prepareHarborSandbox(task: TaskSpec, harbor: HarborRun, archive: TaskArchive, session: SandboxSession, deadline: Deadline): Promise<void> {
  if (harbor.uploadEnvironment && archive.has('environment')) {
    const files = await archive.partAsTar('environment', task.workdir, ROOT);
    await deadline.run('copying environment/ into the workdir', (signal) => session.putArchive(files, '/', signal));
  }
  const check = harbor.healthcheck;
  if (check) await deadline.run('waiting for the healthcheck', (signal) => runHealthcheck(session, check, signal));
}

/**
 * A Harbor task's services, started before its sandbox: images resolved (built when they are a build
 * context), then the namespace holder (registered with the lease as soon as it exists: it ends the
 * whole environment), the volumes and the sidecars in depends_on order, and main's dependencies.
 */
async function startServices(
  task: TaskSpec, services: HarborServices, archive: TaskArchive, runtimeMount: VolumeMount, owner: SandboxOwner,
  deps: SetUpDeps, attempt: EpisodeAttempt, lease: AttemptTrail['lease'], deadline: Deadline,
): Promise<ServiceNetwork> {
  const images = await deadline.run('preparing the task services\' images', (signal) => resolveServiceImages(deps, task, archive, task.image, {
    signal,
    onBuildWait: () => attempt.onPhase?.('build'),
  }));
  attempt.onPhase?.('setup');
  return deadline.run('starting the task services', (signal) => startTaskServices(
    { docker: deps.docker, log: deps.log, callTimeoutMs: deps.callTimeoutMs },
    { owner, services, images, mainImage: task.image, limits: task.limits, runtime: runtimeMount },
    (id, key) => lease.registerContainer(id, key),
    signal,
  ));
}

/** Where the proxy's socket goes when the sandbox is the episode's own: a short folder of the attempt. */
function episodeSocketPath(attempt: EpisodeAttempt, deps: Pick<SetUpDeps, 'dataDir'>): string {
  // A short folder name: a Unix socket path must stay under 108 bytes.
  const folderId = createHash('sha256').update(`${attempt.job.episodeId}/${attempt.attempt}`).digest('hex').slice(0, 16);
  return modelSocketPath(deps.dataDir, folderId);
}

/**
 * The endpoint an episode's agent plays, when it uses a model: the batch's `model.endpoint` (else
 * `default`). A command agent that says nothing uses one when the batch names an endpoint or the worker
 * has `default`. An endpoint this worker lacks fails the attempt before anything is set up: `default`
 * as a model_error naming MODEL_BASE_URL, a named one as unknown_endpoint; both are model failures, so
 * the episode goes back to the queue (another worker may have it) under the model retry budget, and
 * ends as an error of kind model when that is spent, never with a reward.
 */
export function episodeEndpoint(job: EpisodeAttempt['job'], deps: Pick<SetUpDeps, 'model' | 'workerId'>): WorkerEndpoint | undefined {
  const named = job.model?.endpoint;
  const name = named ?? DEFAULT_ENDPOINT;
  const endpoint = deps.model?.endpoints.get(name);
  if (!agentUsesModel(job.agent, endpoint !== undefined || named !== undefined)) return undefined;
  if (endpoint !== undefined) return endpoint;
  if (named === undefined || (named === DEFAULT_ENDPOINT && deps.model === undefined)) {
    throw new FleetError('model_error', `agent ${job.agent.kind} needs a model, and MODEL_BASE_URL is not set on worker ${deps.workerId}`);
  }
  const known = [...(deps.model?.endpoints.keys() ?? [])];
  throw new FleetError(
    'unknown_endpoint',
    `model.endpoint: worker ${deps.workerId} has no endpoint ${JSON.stringify(named)} in its table (it has ${known.length === 0 ? 'none' : known.map((k) => JSON.stringify(k)).join(', ')}); the episode goes back to the queue for a worker that has it (got ${JSON.stringify(named)})`,
  );
}

/** The episode's model proxy: the sandbox's one way out, to its batch's endpoint only. */
async function startEpisodeProxy(attempt: EpisodeAttempt, deps: SetUpDeps, endpoint: WorkerEndpoint, socketPath: string): Promise<ModelProxy> {
  const { job } = attempt;
  const models = deps.model!;
  const batch = job.model;
  const name = batch?.name ?? endpoint.model;
  const forced = endpoint.model !== undefined || batch?.enforce === true ? name : undefined;
  const capture = batch?.capture ?? endpoint.capture ?? 'none';
  return startModelProxy({
    socketPath,
    upstreamBaseUrl: endpoint.baseUrl,
    apiKey: endpoint.apiKey,
    model: forced,
    defaultModel: name,
    sampling: batch?.sampling,
    enforceSampling: batch?.enforce === true,
    budget: { maxCalls: models.maxCalls, maxTokens: models.maxTokens },
    evidenceFile: path.join(deps.evidence.folder(job.episodeId, attempt.attempt), MODEL_CALLS_FILE),
    episodeId: job.episodeId,
    taskId: job.task.id,
    log: deps.log,
    requestTimeoutMs: models.requestTimeoutMs,
    retry: { retries: models.upstreamRetries },
    captureTokens: capture === 'tokens',
    limiter: endpoint.limiter,
    ...(deps.policy && { policy: deps.policy.forEpisode(endpoint.name, job.episodeId, job.maxStaleness) }),
    ...(attempt.onStale && { onStale: attempt.onStale }),
  });
}
