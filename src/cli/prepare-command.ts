// `rollout-fleet prepare <batch.yaml>`: build every Harbor environment of a batch on this host's
// engine ahead of time, with a line of progress each, so the batch's first episodes find their images
// ready. The same builds as a worker's (one per engine and content, under the fleet's Redis lock, a
// failure remembered), so running it beside live workers builds nothing twice.
import { parseArgs } from 'node:util';
import { resolveServiceImages, resolveTaskImage } from '../environments/task-environment.ts';
import { FleetError } from '../errors/fleet-error.ts';
import { loadBatch } from '../tasks/load-task.ts';
import { packTask } from '../tasks/pack-task.ts';
import { TaskArchive } from '../tasks/task-archive.ts';
import { COMMANDS, commandUsage } from './command-table.ts';
import { UsageError, connectProducer, requireRedisUrl, type Cli } from './context.ts';

export async function prepareCommand(cli: Cli, args: string[]): Promise<number> {
  const { positionals } = parseArgs({ args, allowPositionals: true, options: {} });
  const file = positionals[0];
  if (file === undefined || positionals.length > 1) throw new UsageError(`expected one batch file\n${commandUsage('prepare', COMMANDS.prepare)}`);
  const { config } = cli;
  const loaded = await loadBatch(file);
  const harbor = loaded.tasks.filter((t) => t.spec.harbor !== undefined && t.dir !== undefined);
  if (harbor.length === 0) {
    process.stderr.write('no Harbor task in this batch: nothing to build\n');
    return 0;
  }
  const docker = await cli.docker();
  const redis = await connectProducer(requireRedisUrl(config));
  let failed = 0;
  try {
    for (const [i, task] of harbor.entries()) {
      const started = performance.now();
      const packed = await packTask(task.dir!);
      const archive = await TaskArchive.fromBuffer(packed.archive, packed.digest);
      const line = `[${i + 1}/${harbor.length}] ${task.spec.id}`;
      try {
        const image = await resolveTaskImage(
          { docker, redis, prefix: config.FLEET_PREFIX, log: cli.log, callTimeoutMs: config.FLEET_DOCKER_CALL_TIMEOUT_MS },
          task.spec,
          archive,
          { signal: AbortSignal.timeout(((task.spec.harbor!.build?.timeoutSec ?? 0) + 120) * 1000), onBuildWait: () => process.stderr.write(`${line}: building...\n`) },
        );
        const how = image.source === 'docker_image' ? 'docker_image on the engine' : image.build?.built ? 'built' : 'already built';
        // Its task services' images too (built ones cached as the environment is; image: ones checked on the engine).
        const services = task.spec.harbor!.services?.sidecars ?? [];
        if (services.length > 0) {
          await resolveServiceImages(
            { docker, redis, prefix: config.FLEET_PREFIX, log: cli.log, callTimeoutMs: config.FLEET_DOCKER_CALL_TIMEOUT_MS },
            task.spec, archive, image.image,
            { signal: AbortSignal.timeout((services.reduce((n, s) => n + (s.image.from === 'build' ? s.image.timeoutSec : 0), 0) + 120) * 1000) },
          );
        }
        process.stderr.write(`${line}: ${image.image} (${how}${services.length > 0 ? `, and ${services.length} task service image(s)` : ''}, ${((performance.now() - started) / 1000).toFixed(1)} s)\n`);
      } catch (err) {
        if (!(err instanceof FleetError)) throw err;
        failed += 1;
        process.stderr.write(`${line}: ${err.code}: ${err.message.split('\n')[0]}\n`);
      }
    }
  } finally {
    await redis.quit().catch(() => redis.disconnect());
  }
  process.stdout.write(`${harbor.length - failed} of ${harbor.length} environments ready on this host's engine\n`);
  return failed === 0 ? 0 : 1;
}
