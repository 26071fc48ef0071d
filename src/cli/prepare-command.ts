// `rollout-fleet prepare <batch.yaml>`: build every Harbor environment of a batch ahead of time on
// every host that has a live worker, so the batch's first episodes find their images ready. Live
// workers report their engine (host facts); each engine has its own prepare queue, which only its
// workers take, and gets one job per environment. Progress is one line per host and environment as
// each ends (built, already there, or failed with its error's kind and code). The builds are a
// worker's own (one per engine and content, under the fleet's Redis lock, a failure remembered), so
// running it beside busy workers builds nothing twice. With FLEET_REGISTRY the workers' builds are
// once for the fleet: one host builds and pushes, the others pull (their lines say which). With no
// live worker (or --local) it builds on this host's engine (DOCKER_HOST) itself, as before (and
// pushes, with a registry).
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { Job, Queue } from 'bullmq';
import type { Redis } from 'ioredis';
import { PREPARE_JOB, PrepareResult, prepareJobOptions, shortEngineName, type PrepareJob } from '../environments/prepare-job.ts';
import { prepareOtherImages, resolveTaskImage } from '../environments/task-environment.ts';
import { FleetError, outcomeOf } from '../errors/fleet-error.ts';
import { loadBatch } from '../tasks/load-task.ts';
import { packTask } from '../tasks/pack-task.ts';
import { TaskArchive } from '../tasks/task-archive.ts';
import type { TaskSpec } from '../tasks/task-spec.ts';
import { putTaskArchive } from '../tasks/task-store.ts';
import { readHostFacts } from '../worker/host-facts.ts';
import { COMMANDS, PREPARE_OPTIONS, commandUsage } from './command-table.ts';
import { UsageError, connectProducer, positiveOption, requireRedisUrl, type Cli } from './context.ts';

interface HarborTask {
  spec: TaskSpec;
  dir: string;
}

const seconds = (ms: number) => `${(ms / 1000).toFixed(1)} s`;
const buildTimeoutMs = (t: HarborTask) => ((t.spec.harbor?.build?.timeoutSec ?? 0) + 120) * 1000;

export async function prepareCommand(cli: Cli, args: string[]): Promise<number> {
  const { values, positionals } = parseArgs({ args, allowPositionals: true, options: PREPARE_OPTIONS });
  const file = positionals[0];
  if (file === undefined || positionals.length > 1) throw new UsageError(`expected one batch file\n${commandUsage('prepare', COMMANDS.prepare)}`);
  const timeoutMs = positiveOption('timeout-ms', values['timeout-ms']);
  const { config } = cli;
  const loaded = await loadBatch(file);
  const harbor = loaded.tasks.flatMap((t) => (t.spec.harbor !== undefined && t.dir !== undefined ? [{ spec: t.spec, dir: t.dir }] : []));
  if (harbor.length === 0) {
    process.stderr.write('no Harbor task in this batch: nothing to build\n');
    return 0;
  }
  const redis = await connectProducer(requireRedisUrl(config));
  try {
    if (values.local !== true) {
      const facts = await readHostFacts(redis, config.FLEET_PREFIX);
      if (facts.length > 0) return await prepareOnFleet(cli, redis, harbor, facts, timeoutMs);
      process.stderr.write(`no live worker in fleet ${config.FLEET_PREFIX} (none reports its host): building on this host's engine (${config.DOCKER_HOST}) instead; run prepare again once workers run to reach their hosts\n`);
    }
    return await prepareHere(cli, redis, harbor);
  } finally {
    await redis.quit().catch(() => redis.disconnect());
  }
}

/** Today's way, and the one without live workers: every environment built on this process's engine. */
async function prepareHere(cli: Cli, redis: Redis, harbor: HarborTask[]): Promise<number> {
  const { config } = cli;
  const docker = await cli.docker();
  const imageDeps = { docker, redis, prefix: config.FLEET_PREFIX, log: cli.log, callTimeoutMs: config.FLEET_DOCKER_CALL_TIMEOUT_MS, registry: config.FLEET_REGISTRY };
  let failed = 0;
  for (const [i, task] of harbor.entries()) {
    const started = performance.now();
    const packed = await packTask(task.dir);
    const archive = await TaskArchive.fromBuffer(packed.archive, packed.digest);
    const line = `[${i + 1}/${harbor.length}] ${task.spec.id}`;
    try {
      const image = await resolveTaskImage(
        imageDeps,
        task.spec,
        archive,
        { signal: AbortSignal.timeout(buildTimeoutMs(task)), onBuildWait: () => process.stderr.write(`${line}: building...\n`) },
      );
      const how = image.source === 'docker_image' ? 'docker_image on the engine' : image.build?.built ? (image.build.pushed !== undefined ? `built, pushed to ${config.FLEET_REGISTRY}` : 'built') : image.build?.pulled ? `pulled from ${config.FLEET_REGISTRY}` : 'already there';
      // Its task services' images and a separate verifier's too, as set-up would make them.
      const services = await prepareOtherImages(imageDeps, task.spec, archive, image);
      process.stderr.write(`${line}: ${image.image} (${how}${services > 0 ? `, and ${services} task service image(s)` : ''}, ${seconds(performance.now() - started)})\n`);
    } catch (err) {
      if (!(err instanceof FleetError)) throw err;
      failed += 1;
      process.stderr.write(`${line}: failed (${outcomeOf(err.code).kind}: ${err.code}): ${err.message.split('\n')[0]}\n`);
    }
  }
  process.stdout.write(`${harbor.length - failed} of ${harbor.length} environments ready on this host's engine\n`);
  return failed === 0 ? 0 : 1;
}

interface EngineTarget {
  engineId: string;
  /** Host names and worker ids reporting this engine, for the progress lines. */
  label: string;
  queue: Queue;
  pending: Map<string, HarborTask>;
  done: number;
  ready: number;
  built: number;
  pulled: number;
  failed: number;
}

/** One job per environment on every live engine's prepare queue; a line per host and environment as each ends. */
async function prepareOnFleet(
  cli: Cli,
  redis: Redis,
  harbor: HarborTask[],
  facts: Awaited<ReturnType<typeof readHostFacts>>,
  timeoutOpt: number | undefined,
): Promise<number> {
  const prefix = cli.config.FLEET_PREFIX;
  const byEngine = new Map<string, { hosts: Set<string>; workers: string[]; queue?: string }>();
  for (const f of facts) {
    const e = byEngine.get(f.engineId) ?? { hosts: new Set(), workers: [] };
    e.hosts.add(f.host);
    e.workers.push(f.workerId);
    e.queue ??= f.prepareQueue;
    byEngine.set(f.engineId, e);
  }
  // Every archive in the task store first: the jobs name them by digest, as episodes do.
  const jobs: PrepareJob[] = [];
  for (const task of harbor) {
    const packed = await packTask(task.dir);
    await putTaskArchive(redis, prefix, packed);
    jobs.push({ task: task.spec, taskDigest: packed.digest });
  }
  const run = randomUUID().slice(0, 8);
  const targets: EngineTarget[] = [];
  // Engines none of whose workers takes prepare jobs (a version before them, or one still starting).
  const unreachable: string[] = [];
  for (const [engineId, e] of byEngine) {
    const label = `${[...e.hosts].join(',')} (engine ${shortEngineName(engineId)}, worker${e.workers.length === 1 ? '' : 's'} ${e.workers.join(',')})`;
    if (e.queue === undefined) unreachable.push(label);
    else targets.push({ engineId, label, queue: new Queue(e.queue, { connection: redis, prefix }), pending: new Map(), done: 0, ready: 0, built: 0, pulled: 0, failed: 0 });
  }
  for (const label of unreachable) {
    process.stderr.write(`${label}: not prepared: its workers take no prepare jobs (a version before them, or still starting); run prepare again, or prepare --local on that host\n`);
  }
  process.stderr.write(`preparing ${harbor.length} environment${harbor.length === 1 ? '' : 's'} on ${targets.length} host${targets.length === 1 ? '' : 's'}: ${targets.map((t) => t.label).join('; ')}\n`);
  const started = performance.now();
  // Each host's workers take its jobs at least one at a time: the sum of the build timeouts bounds it.
  const timeoutMs = timeoutOpt ?? harbor.reduce((sum, t) => sum + buildTimeoutMs(t), 0);
  try {
    for (const t of targets) {
      await t.queue.addBulk(jobs.map((data, i) => {
        const id = `${run}-${i}`;
        t.pending.set(id, harbor[i]!);
        return { name: PREPARE_JOB, data, opts: { ...prepareJobOptions, jobId: id } };
      }));
    }
    const line = (t: EngineTarget, task: HarborTask, text: string) => {
      t.done += 1;
      process.stderr.write(`${t.label} [${t.done}/${harbor.length}] ${task.spec.id}: ${text}\n`);
    };
    const fail = (t: EngineTarget, id: string, kind: string, code: string, message: string) => {
      const task = t.pending.get(id)!;
      t.pending.delete(id);
      t.failed += 1;
      line(t, task, `failed (${kind}: ${code}): ${message}`);
    };
    let lastFactsCheck = performance.now();
    while (targets.some((t) => t.pending.size > 0)) {
      for (const t of targets) {
        for (const id of [...t.pending.keys()]) {
          const job = await Job.fromId(t.queue, id);
          if (job === undefined) {
            fail(t, id, 'infra', 'prepare_job_lost', 'the job left the queue before it ended');
            continue;
          }
          if (job.finishedOn === undefined) continue;
          const parsed = PrepareResult.safeParse(job.returnvalue);
          if (!parsed.success) {
            fail(t, id, 'infra', 'unexpected', job.failedReason ?? 'the worker answered no result');
            continue;
          }
          const r = parsed.data;
          if (r.status === 'failed') {
            fail(t, id, r.kind, r.code, r.message);
            continue;
          }
          const task = t.pending.get(id)!;
          t.pending.delete(id);
          t.ready += 1;
          if (r.how === 'built') t.built += 1;
          if (r.how === 'pulled') t.pulled += 1;
          const how = r.how === 'built' ? `built by ${r.workerId}${r.pushed !== undefined ? `, pushed as ${r.pushed}` : ''}`
            : r.how === 'pulled' ? `pulled by ${r.workerId} from the registry`
            : r.how === 'docker_image' ? 'docker_image on the engine' : 'already there';
          line(t, task, `${r.image} (${how}, ${seconds(r.ms)})`);
        }
      }
      if (!targets.some((t) => t.pending.size > 0)) break;
      const elapsed = performance.now() - started;
      if (elapsed > timeoutMs) {
        for (const t of targets) {
          for (const id of [...t.pending.keys()]) {
            await t.queue.remove(id).catch(() => undefined);
            fail(t, id, 'infra', 'prepare_timeout', `not done within ${timeoutMs} ms (--timeout-ms)`);
          }
        }
        break;
      }
      // A host whose workers all went: its jobs would wait for nobody.
      if (performance.now() - lastFactsCheck > 2_000) {
        lastFactsCheck = performance.now();
        const live = new Set((await readHostFacts(redis, prefix)).map((f) => f.engineId));
        for (const t of targets) {
          if (live.has(t.engineId) || t.pending.size === 0) continue;
          for (const id of [...t.pending.keys()]) {
            const state = await t.queue.getJobState(id);
            if (state === 'completed' || state === 'failed') continue; // read on the next pass
            await t.queue.remove(id).catch(() => undefined);
            fail(t, id, 'infra', 'worker_lost', 'no live worker of this host any more');
          }
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  } finally {
    await Promise.all(targets.map((t) => t.queue.close().catch(() => undefined)));
  }
  let failed = 0;
  for (const label of unreachable) {
    failed += harbor.length;
    process.stdout.write(`${label}: 0 of ${harbor.length} environments ready (its workers take no prepare jobs)\n`);
  }
  for (const t of targets) {
    failed += t.failed;
    process.stdout.write(`${t.label}: ${t.ready} of ${harbor.length} environments ready (${t.built} built, ${t.pulled > 0 ? `${t.pulled} pulled, ` : ''}${t.ready - t.built - t.pulled} already there), ${t.failed} failed\n`);
  }
  return failed === 0 ? 0 : 1;
}
