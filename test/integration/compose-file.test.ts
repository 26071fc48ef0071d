// docker-compose.yml as Debian's docker-compose renders it (`docker-compose config`): Redis durable and
// noeviction, workers scalable with the Docker socket and the data folder at the same path inside and
// out, the dashboard on the host's loopback with required credentials, the model stub.
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { BIN, ROOT } from '../helpers/fleet.ts';

const COMPOSE = path.join(ROOT, 'docker-compose.yml');

interface Service {
  image?: string;
  build?: unknown;
  command?: string[];
  environment?: Record<string, string>;
  volumes?: string[];
  ports?: string[];
  container_name?: string;
  depends_on?: Record<string, unknown>;
}

async function composeConfig(env: Record<string, string>) {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('FLEET_')));
  try {
    const { stdout } = await promisify(execFile)('docker-compose', ['-f', COMPOSE, '--project-directory', ROOT, 'config'], { env: { ...base, ...env } });
    return { ok: true, config: parse(stdout) as { services: Record<string, Service> }, stderr: '' };
  } catch (err) {
    const e = err as { code?: string; stderr?: string };
    if (e.code === 'ENOENT') throw new Error('docker-compose is not installed: run .ci/setup-host.sh');
    return { ok: false, config: undefined, stderr: e.stderr ?? '' };
  }
}

describe('docker-compose.yml', () => {
  it('renders the fleet: durable Redis, scalable workers, dashboard, API, model stub', async () => {
    const { ok, config, stderr } = await composeConfig({ FLEET_DASHBOARD_USER: 'ops', FLEET_DASHBOARD_PASSWORD: 'pw', FLEET_API_TOKEN: 'a-token-of-16-chars', FLEET_DATA_DIR: '/srv/fleet' });
    expect(ok, stderr).toBe(true);
    const s = config!.services;
    expect(Object.keys(s).sort()).toEqual(['api', 'dashboard', 'model-stub', 'redis', 'worker']);

    const api = s.api!;
    expect(api.command).toEqual(['api']);
    expect(api.environment).toMatchObject({ FLEET_API_TOKEN: 'a-token-of-16-chars', FLEET_API_HOST: '0.0.0.0', REDIS_URL: 'redis://redis:6379' });
    expect(api.ports).toEqual(['127.0.0.1:3100:3100/tcp']);
    expect(api.volumes).toEqual(['/srv/fleet:/srv/fleet:ro']);

    expect(s.redis!.command).toEqual(expect.arrayContaining(['--appendonly', 'yes', '--maxmemory-policy', 'noeviction']));
    expect(s.redis!.ports?.every((p) => p.startsWith('127.0.0.1:'))).toBe(true);

    const worker = s.worker!;
    expect(worker.command).toEqual(['worker']);
    // Scalable: no fixed name, no host port to collide on.
    expect(worker.container_name).toBeUndefined();
    expect(worker.ports).toBeUndefined();
    expect(worker.volumes).toEqual(expect.arrayContaining(['/var/run/docker.sock:/var/run/docker.sock:rw', '/srv/fleet:/srv/fleet:rw']));
    expect(worker.environment).toMatchObject({ REDIS_URL: 'redis://redis:6379', FLEET_DATA_DIR: '/srv/fleet', FLEET_SANDBOX_POOL: '1' });

    const dashboard = s.dashboard!;
    expect(dashboard.command).toEqual(['dashboard']);
    expect(dashboard.environment).toMatchObject({ FLEET_DASHBOARD_USER: 'ops', FLEET_DASHBOARD_PASSWORD: 'pw', FLEET_DASHBOARD_WRITE: 'false', FLEET_DATA_DIR: '/srv/fleet' });
    expect(dashboard.ports).toEqual(['127.0.0.1:3000:3000/tcp']);
    expect(dashboard.volumes).toEqual(['/srv/fleet:/srv/fleet:ro']);
    expect(dashboard.volumes!.join()).not.toContain('docker.sock');

    // The stub's command is one the CLI takes (run here with a free port and this repository's tasks),
    // and the workers point at it unless a real endpoint is configured.
    const stubArgs = s['model-stub']!.command as string[];
    expect(stubArgs).toEqual(['model-stub', '--port', '8000', '--host', '0.0.0.0', '--any-host', '--tasks', '/opt/rollout-fleet/examples/tasks', '--delay-ms', '0']);
    const local = stubArgs.map((a) => (a === '8000' ? '0' : a === '0.0.0.0' ? '127.0.0.1' : a.replace('/opt/rollout-fleet/', ROOT)));
    const stub = spawn(process.execPath, [BIN, ...local], { stdio: ['ignore', 'pipe', 'ignore'], env: { ...process.env, LOG_LEVEL: 'silent' } });
    const [firstLine] = (await once(stub.stdout!, 'data')) as [Buffer];
    stub.kill('SIGTERM');
    await once(stub, 'exit');
    expect(firstLine.toString()).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v1/);
    expect(s.worker!.environment).toMatchObject({ MODEL_BASE_URL: 'http://model-stub:8000/v1' });
    // One image for the fleet's services, built from this repository.
    for (const name of ['worker', 'dashboard', 'api', 'model-stub']) expect([s[name]!.image, s[name]!.build], name).toEqual(['rollout-fleet:local', { context: ROOT.replace(/\/$/, '') }]);
  });

  it('refuses to render without dashboard credentials or an API token', async () => {
    const { ok, stderr } = await composeConfig({ FLEET_API_TOKEN: 'a-token-of-16-chars' });
    expect(ok).toBe(false);
    expect(stderr).toContain('set FLEET_DASHBOARD_USER');
    const noToken = await composeConfig({ FLEET_DASHBOARD_USER: 'ops', FLEET_DASHBOARD_PASSWORD: 'pw' });
    expect(noToken.ok).toBe(false);
    expect(noToken.stderr).toContain('set FLEET_API_TOKEN');
  });
});
