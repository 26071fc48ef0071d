// Harbor's separate verifier (`[verifier.environment]` or tests/Dockerfile): the tamper-proof mode. The
// agent never shares a container with the grader's tools: after the agent, the `[[verifier.collect]]`
// hooks run in its container (or in the task service a hook names), /logs/artifacts and the declared
// artifacts (of main or of a task service) are copied out, and the container and its task services are
// stopped (every process of them gone). A fresh container of the verifier's image (built
// from tests/ in set-up, or its docker_image, or the agent's image started afresh) gets the artifacts
// at their absolute paths, and the tests unless its image holds them; then test.sh runs there as
// [verifier].user with [verifier].env, and the reward file is read from it. Nothing else of the agent's
// container reaches it: a root agent that replaced python3, pytest or bash replaced them in a
// container that no longer runs. The verifier's /logs/verifier is copied back into the agent's
// container's /logs, so evidence is kept in one place, and the verifier's container is removed here
// (the reaper removes it after a kill -9: it carries the episode's labels).
import path from 'node:path';
import type { Readable } from 'node:stream';
import type { Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { shellQuote } from '../files/shell-quote.ts';
import { removeEnvironment } from '../sandbox/environment-lease.ts';
import { harborKeepAlive } from '../sandbox/container-spec.ts';
import { ArchiveTooLarge, downloadArchive } from '../sandbox/archive-download.ts';
import { dockerCall } from '../sandbox/docker-client.ts';
import { SandboxSession } from '../sandbox/sandbox-session.ts';
import { execInService, killServices } from '../sandbox/task-services.ts';
import type { HarborRun, TaskSpec } from '../tasks/task-spec.ts';
import type { AttemptTrail, EpisodeAttempt, EpisodeDeps, SetUpResult } from './episode-attempt.ts';
import { HARBOR_VERIFIER_RESET, execAsRoot, harborLogsTar } from './harbor-checks.ts';
import { readSandboxReward, type Reward } from './reward-file.ts';
import { runVerifier } from './run-verifier.ts';
import { openVerifierEgress } from './verifier-egress.ts';
import { hasEgress } from '../egress/network-grant.ts';
import { phaseGrants } from './phase-egress.ts';

export type SeparateVerifyDeps = Pick<EpisodeDeps, 'docker' | 'callTimeoutMs' | 'log' | 'prefix' | 'workerId' | 'outputCapBytes' | 'snapshotLimits' | 'sandboxRuntime' | 'network' | 'evidence'>;

const TESTS_DIR = '/tests';
const ROOT_OWNER = { uid: 0, gid: 0 } as const;

/** A task service's files, copied out through the engine as a session's are. */
function sidecarArchives(deps: SeparateVerifyDeps, containerId: string): Pick<SandboxSession, 'getArchive'> {
  return {
    getArchive: (source, signal) => dockerCall('get archive', { timeoutMs: deps.callTimeoutMs, signal }, (abortSignal) =>
      deps.docker.getContainer(containerId).getArchive({ path: source, abortSignal } as never)) as Promise<Readable>,
  };
}

/** A tar of `source` copied out of `session`, at most `capBytes`: a larger artifact is the agent's doing. */
async function copyOut(session: Pick<SandboxSession, 'getArchive'>, source: string, capBytes: number, signal: AbortSignal): Promise<Buffer | undefined> {
  return downloadArchive(session, source, capBytes, signal).catch((err: unknown) => {
    if (err instanceof ArchiveTooLarge) throw new FleetError('artifact_too_large', `the artifact ${source} is larger than ${capBytes} bytes (the evidence snapshot's limit)`);
    throw err;
  });
}

export async function verifySeparately(
  attempt: EpisodeAttempt,
  deps: SeparateVerifyDeps,
  made: Pick<SetUpResult, 'archive' | 'proxy' | 'runtime' | 'verifierImage' | 'services' | 'runFolder'>,
  session: SandboxSession,
  trail: Pick<AttemptTrail, 'verifyRun'>,
  harbor: HarborRun,
  deadline: Deadline,
  /** The task's folders that make /tests (a step's over the task's), and whether the agent's environment stops (not between steps). */
  opts: { testsParts: readonly string[]; stopsAgent: boolean } = { testsParts: ['tests'], stopsAgent: true },
): Promise<Reward> {
  const task: TaskSpec = attempt.job.task;
  const separate = harbor.separateVerifier!;
  const image = made.verifierImage;
  if (image === undefined || made.runtime === undefined) throw new FleetError('docker_error', 'the separate verifier\'s image was not prepared in set-up');
  const asRootIn = (s: SandboxSession, what: string, command: string) => execAsRoot(s, deadline, what, command);

  const services = made.services;
  const servicesDeps = { docker: deps.docker, log: deps.log, callTimeoutMs: deps.callTimeoutMs };
  const sidecarOf = (service: string): string => {
    const id = services?.sidecars[service];
    if (id === undefined) throw new FleetError('docker_error', `task service ${service} was not started in set-up`);
    return id;
  };
  // 1. The collect hooks, in the agent's container (or the task service named) while it still runs:
  //    best effort, as in Harbor.
  for (const [i, hook] of harbor.collect.entries()) {
    const service = hook.service;
    const run = await deadline.run(`running verifier.collect.${i}`, async (signal) => service === undefined
      ? session.exec(hook.command, { timeoutMs: hook.timeoutSec * 1000, capBytes: 64 * 1024, user: hook.user ?? '', signal })
      : { exitCode: await execInService(servicesDeps, sidecarOf(service), hook.command, { timeoutMs: hook.timeoutSec * 1000, signal, ...(hook.user !== undefined && { user: hook.user }) }), timedOut: false },
    ).catch((err: unknown) => ({ exitCode: null, timedOut: false, error: String(err) }));
    if (run.exitCode !== 0) deps.log.info({ episodeId: attempt.job.episodeId, hook: i, service: service ?? 'main', exitCode: run.exitCode, timedOut: run.timedOut }, 'a verifier.collect hook failed (best effort: grading goes on)');
  }
  // 2. What the verifier may see, copied out: /logs/artifacts and the declared artifacts (of main or a task service).
  const cap = deps.snapshotLimits.maxBytes;
  const carried: { dir: string; tar: Buffer }[] = [];
  for (const { source, service } of [{ source: '/logs/artifacts', service: undefined }, ...harbor.artifacts]) {
    const from = service === undefined ? session : sidecarArchives(deps, sidecarOf(service));
    const tar = await deadline.run(`copying ${source} out`, (signal) => copyOut(from, source, cap, signal));
    if (tar === undefined) {
      deps.log.info({ episodeId: attempt.job.episodeId, source, service: service ?? 'main' }, 'an artifact is missing');
      continue;
    }
    carried.push({ dir: path.posix.dirname(source), tar });
  }
  // 3. The agent's container stops (a reward file planted in its /logs/verifier goes first), its task
  //    services too (the verifier does not join them, as in Harbor); the model too.
  //    Between the steps of a multi-step task the environment goes on (the next step's agent works in it).
  await asRootIn(session, 'emptying the agent\'s /logs/verifier', HARBOR_VERIFIER_RESET);
  if (opts.stopsAgent) {
    await deadline.run('stopping the agent\'s container', (signal) => session.kill(signal));
    if (services) await deadline.run('stopping the task services', (signal) => killServices(servicesDeps, services, signal));
  }
  await deadline.run('closing the model proxy', async () => made.proxy?.close());

  // 4. The verifier's own container, owned by the episode (its labels let the reaper find it).
  const owner = { fleet: deps.prefix, episodeId: attempt.job.episodeId, batchId: attempt.job.batchId, workerId: deps.workerId, attempt: attempt.attempt };
  let verifierId: string | undefined;
  let verifier: SandboxSession | undefined;
  try {
    const workdir = separate.workdir ?? (image.config.workdir.startsWith('/') ? image.config.workdir : '/');
    const logsTar = await harborLogsTar();
    verifier = await deadline.run('creating the verifier\'s container', (signal) => SandboxSession.open(
      { docker: deps.docker, log: deps.log, callTimeoutMs: deps.callTimeoutMs },
      {
        image: image.image, workdir, owner,
        limits: { ...task.limits, ...separate.limits },
        mounts: [made.runtime!.mount],
        harbor: { env: separate.env, user: harbor.verifierUser, keepAlive: harborKeepAlive(made.runtime!.mountPath) },
        filesBeforeStart: logsTar,
        runtime: deps.sandboxRuntime,
        // The run folder only when the grader has network: its egress socket goes there.
        bindFolders: hasEgress(phaseGrants(task, deps.network)?.verifier) && made.runFolder !== undefined ? [made.runFolder] : [],
      },
      (id) => (verifierId = id),
      signal,
    ), (late) => {
      late.stopWatching();
      void removeEnvironment(deps.docker, late.containerId, deps.callTimeoutMs).catch(() => undefined);
    });
    const v = verifier;
    // /logs came with the container (written before its start); a /logs/verifier its image held goes.
    await asRootIn(v, 'emptying /logs/verifier in the verifier\'s container', HARBOR_VERIFIER_RESET);
    for (const { dir, tar } of carried) {
      await asRootIn(v, `making ${dir} in the verifier's container`, `mkdir -p ${shellQuote(dir)}`);
      await deadline.run(`restoring the artifacts into ${dir}`, (signal) => v.putArchive(tar, dir, signal).catch((err: unknown) => {
        // The engine refuses what the task's own files hold (a link out of the container): not the fleet's failure.
        if (/error processing tar file|invalid symlink/i.test(String((err as Error).message ?? err))) {
          throw new FleetError('artifact_invalid', `the artifacts for ${dir} could not be restored into the verifier's container: the engine refused them (${String((err as Error).message).slice(0, 200)})`);
        }
        throw err;
      }));
    }
    // Harbor's verifier image holds /tests/test.sh; one that does not gets tests/ (never the agent's container).
    const hasTests = await deadline.run('looking for /tests/test.sh', (signal) => v.exec(`test -f ${TESTS_DIR}/test.sh`, { timeoutMs: 30_000, capBytes: 1024, user: '0', workdir: '/', signal }));
    // A step's own tests/ go over them either way.
    const parts = hasTests.exitCode === 0 ? opts.testsParts.filter((p) => p !== 'tests') : opts.testsParts;
    for (const part of parts.filter((p) => made.archive.has(p))) {
      const tests = await made.archive.partAsTar(part, TESTS_DIR, ROOT_OWNER);
      await deadline.run(`copying ${part}/ in`, (signal) => v.putArchive(tests, '/', signal));
    }
    await asRootIn(v, 'making test.sh executable', `chmod +x ${TESTS_DIR}/test.sh`);
    const egress = await openVerifierEgress(attempt, deps, made, v, deadline);
    try {
      await runVerifier(v, deadline, trail, task.verify.command, task.verify.timeoutSec, {
        capBytes: deps.outputCapBytes, env: { ...harbor.verifierEnv, ...egress?.env }, user: harbor.verifierUser ?? '',
      });
    } finally {
      await egress?.close().catch((err: unknown) => deps.log.warn({ err: String(err) }, 'closing the verifier\'s egress proxy failed'));
    }
    return await deadline.run('reading the reward file', (signal) => readSandboxReward(v, signal));
  } finally {
    // The verifier's logs join the agent's container's /logs, which close keeps as evidence.
    if (verifier !== undefined) {
      const v = verifier;
      await downloadArchive(v, '/logs/verifier', cap, AbortSignal.timeout(deps.callTimeoutMs))
        .then((tar) => tar && session.putArchive(tar, '/logs', AbortSignal.timeout(deps.callTimeoutMs)))
        .catch((err: unknown) => deps.log.warn({ episodeId: attempt.job.episodeId, err: String(err) }, 'keeping the verifier\'s /logs/verifier failed'));
      v.stopWatching();
    }
    if (verifierId !== undefined) {
      await removeEnvironment(deps.docker, verifierId, deps.callTimeoutMs)
        .catch((err: unknown) => deps.log.warn({ episodeId: attempt.job.episodeId, containerId: verifierId, err: String(err) }, 'removing the verifier\'s container failed; the reaper will'));
    }
  }
}
