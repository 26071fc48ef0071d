// A Harbor multi-step task (`[[steps]]`), as Harbor's multi-step trial runs it (H:trial/multi_step.py):
// one environment for every step, in order. Per step: /logs/agent emptied, steps/<name>/workdir/ put
// into the workdir and its setup.sh run, the step's healthcheck, the agent with the step's instruction
// under the step's timeout, then the verifier with the task's tests/ and the step's tests/ over them
// (/logs/verifier and /tests emptied first): shared, or a separate verifier's container per step, the
// agent's environment stopped only after the last step. A step whose reward misses its `min_reward` stops the
// steps after it. The episode's reward is the per-key mean over the steps graded (`mean`, Harbor's
// default) or the last step graded (`final`); each step's own reward is kept as metric `steps.<name>`.
// Where Harbor records a step's grading failure and aggregates the others, here it ends the episode
// as an error with a kind: a grade that could not be given is never read as one.
// Each step's /logs/agent and /logs/verifier are copied to /logs/steps/<name>/ before the next, so the
// evidence (close keeps /logs) holds every step. At each step boundary the graded steps and a tar of
// the workdir are written to Redis, so a retried attempt (a worker killed in step 3, on any host)
// restores the workdir and resumes at step 3; what the steps left outside the workdir is not kept.
import path from 'node:path';
import type { AgentRun } from '../agent/agent.ts';
import { episodeStepsKey } from '../redis/redis-keys.ts';
import { downloadArchive } from '../sandbox/archive-download.ts';
import { Deadline } from '../deadlines/deadline.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { shellQuote } from '../files/shell-quote.ts';
import type { SandboxSession } from '../sandbox/sandbox-session.ts';
import type { HarborRun, TaskSpec } from '../tasks/task-spec.ts';
import { runAgent } from './agent-phase.ts';
import type { AttemptTrail, EpisodeAttempt, EpisodeDeps, Graded, SetUpResult } from './episode-attempt.ts';
import { msSince } from './episode-attempt.ts';
import { execAsRoot, runHealthcheck } from './harbor-checks.ts';
import { verifyHarbor } from './harbor-verify.ts';
import { passes } from '../tasks/batch-spec.ts';
import { mainReward } from './reward-file.ts';

type Step = NonNullable<HarborRun['steps']>[number];

const ROOT = { uid: 0, gid: 0 } as const;

/** The task a step runs as: its instruction, its timeouts as the agent's ceiling and the verifier's, its users and env. */
export function stepTask(task: TaskSpec, harbor: HarborRun, step: Step): TaskSpec {
  const { setupSec, closeSec } = task.reserves;
  // A separate verifier also runs the collect hooks and creates its container within the reserve, as for the task.
  const verifySec = step.verifierTimeoutSec + 10 + (harbor.separateVerifier ? 30 + harbor.collect.reduce((sum, c) => sum + c.timeoutSec, 0) : 0);
  return {
    ...task,
    instruction: step.instruction,
    verify: { command: task.verify.command, timeoutSec: step.verifierTimeoutSec },
    deadlineSec: setupSec + step.agentTimeoutSec + verifySec + closeSec,
    reserves: { setupSec, verifySec, closeSec },
    harbor: {
      ...harbor,
      currentStep: step.name,
      verifierEnv: step.verifierEnv,
      ...(step.agentUser !== undefined ? { agentUser: step.agentUser } : {}),
      ...(step.verifierUser !== undefined ? { verifierUser: step.verifierUser } : {}),
    },
  };
}

/** Why `metrics` misses the step's gate, or undefined when it passes (a key it lacks counts as missing). */
export function missedGate(minReward: Record<string, number> | undefined, metrics: Record<string, number>): string | undefined {
  for (const [key, threshold] of Object.entries(minReward ?? {})) {
    const actual = metrics[key];
    if (actual === undefined || actual < threshold) return `${key}=${actual ?? 'missing'} below min_reward ${threshold}`;
  }
  return undefined;
}

/** The episode's metrics from its graded steps: per-key means (a key a step lacks counts 0), or the last step's. */
export function aggregateSteps(strategy: 'mean' | 'final', graded: { metrics: Record<string, number> }[]): Record<string, number> {
  if (strategy === 'final') return { ...graded.at(-1)!.metrics };
  const keys = [...new Set(graded.flatMap((g) => Object.keys(g.metrics)))];
  return Object.fromEntries(keys.map((k) => [k, graded.reduce((sum, g) => sum + (g.metrics[k] ?? 0), 0) / graded.length]));
}

export async function runHarborSteps(
  attempt: EpisodeAttempt,
  deps: EpisodeDeps,
  made: SetUpResult,
  session: SandboxSession,
  trail: AttemptTrail,
  harbor: HarborRun,
): Promise<Graded> {
  const task = attempt.job.task;
  const steps = harbor.steps!;
  const progressKey = episodeStepsKey(deps.prefix, attempt.job.episodeId);
  const graded: GradedStep[] = attempt.attempt > 1 ? await resumeSteps(attempt, deps, session, steps, progressKey) : [];
  let timedOut = false;
  trail.timings.agentMs = 0;
  trail.timings.verifyMs = 0;
  for (const [index, step] of steps.entries()) {
    if (index < graded.length) continue;
    const last = index === steps.length - 1;
    const ran: EpisodeAttempt = { ...attempt, job: { ...attempt.job, task: stepTask(task, harbor, step) } };
    const ranHarbor = ran.job.task.harbor!;
    await prepareStep(ran, step, session, made, deps);

    attempt.onPhase?.('agent');
    const agentRun: AgentRun = await runAgent(ran, deps, made, session, trail, undefined);
    trail.agentRun = agentRun;
    trail.timings.agentMs += agentRun.durationMs;
    timedOut ||= agentRun.timedOut;
    attempt.signal.throwIfAborted();

    attempt.onPhase?.('verify');
    const tVerify = performance.now();
    // The model stays for the steps after this one: it goes before the last step is graded.
    // A separate verifier stops the agent's environment only after the last step (as Harbor's does).
    const grade = await verifyHarbor(ran, deps, { ...made, proxy: last ? made.proxy : undefined }, session, trail, agentRun, ranHarbor, { testsParts: ['tests', `steps/${step.name}/tests`], last })
      .finally(() => (trail.timings.verifyMs! += msSince(tVerify)));
    const metrics = grade.metrics ?? { reward: grade.reward ?? 0 };
    graded.push({ name: step.name, reward: grade.reward ?? 0, metrics });
    // The last step's logs stay in /logs/agent and /logs/verifier; a stopped container takes no exec.
    if (!(last && harbor.separateVerifier)) await keepStepLogs(session, step.name, attempt.signal);
    const missed = missedGate(step.minReward, metrics);
    if (missed !== undefined) {
      deps.log.info({ step: step.name, missed }, 'a step missed its min_reward: the steps after it do not run');
      break;
    }
    if (!last) await saveSteps(deps, session, task.workdir, graded, progressKey, attempt.signal);
  }
  await made.proxy?.close();
  await deps.redis.del(progressKey).catch(() => undefined);
  const metrics = aggregateSteps(harbor.stepStrategy ?? 'mean', graded);
  const reward = mainReward(metrics);
  for (const g of graded) metrics[`steps.${g.name}`] = g.reward;
  return { status: timedOut ? 'timeout' : passes(reward, attempt.job.passThreshold) ? 'passed' : 'failed', reward, metrics };
}

type GradedStep = { name: string; reward: number; metrics: Record<string, number> };

/** How long a step boundary's progress is kept for a retry. */
const STEPS_TTL_MS = 7 * 24 * 3600 * 1000;

/** The graded steps and the workdir at this boundary, in Redis; skipped (logged) when the workdir is over the snapshot's size. */
async function saveSteps(deps: Pick<EpisodeDeps, 'redis' | 'log' | 'snapshotLimits'>, session: SandboxSession, workdir: string, graded: GradedStep[], key: string, signal: AbortSignal): Promise<void> {
  const tar = await downloadArchive(session, workdir, deps.snapshotLimits.maxBytes, signal).catch((err: unknown) => {
    deps.log.warn({ err: String(err) }, 'the workdir was not kept at this step boundary: a retry starts from the first step');
    return undefined;
  });
  if (tar === undefined) {
    await deps.redis.del(key);
    return;
  }
  await deps.redis.multi().del(key).hset(key, 'done', JSON.stringify(graded), 'workdir', tar).pexpire(key, STEPS_TTL_MS).exec();
}

/** A retry's steps already graded, their workdir restored into the new sandbox; none when no boundary was kept. */
async function resumeSteps(attempt: EpisodeAttempt, deps: Pick<EpisodeDeps, 'redis' | 'log'>, session: SandboxSession, steps: readonly Step[], key: string): Promise<GradedStep[]> {
  const [done, tar] = await Promise.all([deps.redis.hget(key, 'done'), deps.redis.hgetBuffer(key, 'workdir')]);
  if (done === null || tar === null) return [];
  const graded = JSON.parse(done) as GradedStep[];
  // Only a prefix of this task's steps, in order, is taken (the task cannot change under a job, but a record is data).
  if (graded.length >= steps.length || graded.some((g, i) => g.name !== steps[i]!.name)) return [];
  await session.putArchive(tar, path.posix.dirname(attempt.job.task.workdir), attempt.signal);
  deps.log.info({ steps: graded.map((g) => g.name) }, 'resuming a multi-step episode after its last step boundary');
  return graded;
}

/** Before a step's agent: /logs/agent emptied, the step's workdir/ put in and its setup.sh run, its healthcheck passed. */
async function prepareStep(ran: EpisodeAttempt, step: Step, session: SandboxSession, made: SetUpResult, deps: Pick<EpisodeDeps, 'log'>): Promise<void> {
  const task = ran.job.task;
  const deadline = new Deadline('set-up', task.reserves.setupSec * 1000, ran.signal);
  try {
    await execAsRoot(session, deadline, 'emptying /logs/agent', 'rm -rf /logs/agent && mkdir -p /logs/agent && chmod 777 /logs/agent');
    if (step.has.workdir) {
      const files = await made.archive.partAsTar(`steps/${step.name}/workdir`, task.workdir, ROOT);
      await deadline.run(`copying steps/${step.name}/workdir/ in`, (signal) => session.putArchive(files, '/', signal));
    }
    if (step.has.setup) {
      const script = `${task.workdir.replace(/\/$/, '')}/setup.sh`;
      const run = await deadline.run(`running steps/${step.name}/workdir/setup.sh`, (signal) => session.exec(`bash ${shellQuote(script)}`, {
        timeoutMs: deadline.remainingMs, capBytes: 64 * 1024, user: task.harbor?.agentUser ?? '', signal,
      }));
      if (run.exitCode !== 0) {
        throw new FleetError('step_setup_failed', `steps/${step.name}/workdir/setup.sh exited with ${run.exitCode}${run.timedOut ? ' (timed out)' : ''}: ${run.stderr.text.slice(0, 300)}`);
      }
    }
    const check = step.healthcheck;
    if (check) await deadline.run(`waiting for the healthcheck of step ${step.name}`, (signal) => runHealthcheck(session, check, signal));
    deps.log.debug({ step: step.name }, 'step ready');
  } finally {
    deadline.dispose();
  }
}

/** The step's /logs/agent and /logs/verifier copied to /logs/steps/<name>/ (kept with /logs as evidence). */
async function keepStepLogs(session: SandboxSession, name: string, signal: AbortSignal): Promise<void> {
  const dir = shellQuote(`/logs/steps/${name}`);
  await session.exec(`mkdir -p ${dir} && cp -a /logs/agent /logs/verifier ${dir}/`, { timeoutMs: 30_000, capBytes: 4096, user: '0', workdir: '/', signal });
}
