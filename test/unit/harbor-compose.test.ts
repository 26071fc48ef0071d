// environment/docker-compose.yaml read at enqueue: what Harbor's compose files use lands in the
// TaskSpec's services, and a hostile corpus (every key that would reach past the episode's own
// containers) is refused with a message naming the service and the key, never the file's content.
import { describe, expect, it } from 'vitest';
import { ComposeProblem, composeDuration, readHarborCompose, shellWords } from '../../src/tasks/harbor-compose.ts';
import { HarborServices } from '../../src/tasks/task-spec.ts';

const CTX = { cpus: 2, memoryMb: 2048, buildTimeoutSec: 300, exists: (rel: string) => ['environment/api/Dockerfile', 'environment/Dockerfile', 'environment/api/Dockerfile.dev'].includes(rel) };

function read(text: string, host: Record<string, string> = {}) {
  return readHarborCompose(text, CTX, host);
}
function refusal(text: string, host: Record<string, string> = {}): string {
  try {
    read(text, host);
  } catch (err) {
    expect(err).toBeInstanceOf(ComposeProblem);
    return (err as Error).message;
  }
  throw new Error('accepted, but should have been refused');
}
/** A compose file with main and one sidecar `api` carrying `extra` (YAML lines indented under api). */
const withApi = (extra: string, top = '') => `services:\n  main: {}\n  api:\n    image: python:3.12-slim\n${extra.split('\n').map((l) => `    ${l}`).join('\n')}\n${top}`;

describe('task services (environment/docker-compose.yaml)', () => {
  it('reads sidecars, depends_on (both forms), healthchecks, shared volumes, command, entrypoint, environment, working_dir, expose', () => {
    const s = read(`
services:
  main:
    build: { context: "\${CONTEXT_DIR}" }
    image: \${MAIN_IMAGE_NAME}
    command: ["sh", "-c", "sleep infinity"]
    deploy: { resources: { limits: { cpus: "\${CPUS}", memory: "\${MEMORY}" } } }
    depends_on:
      api: { condition: service_healthy }
      db: { condition: service_started }
    environment: { API_URL: "http://api:8000" }
    volumes: ["shared:/data"]
  api:
    build: { context: ./api, dockerfile: Dockerfile.dev }
    command: python3 -m http.server 8000 --bind "127.0.0.1"
    entrypoint: ["/usr/bin/env"]
    environment: [MODE=test, "GREETING=hi there"]
    working_dir: /srv
    expose: ["8000", 9000]
    user: "1000:1000"
    depends_on: [db]
    healthcheck:
      test: ["CMD-SHELL", "curl -fs http://localhost:8000/ || exit 1"]
      interval: 1s
      timeout: 500ms
      retries: 10
      start_period: 1m30s
    volumes: ["shared:/srv/data:ro"]
  db:
    image: \${MAIN_IMAGE_NAME}
    command: ["sleep", "infinity"]
    healthcheck: { test: "true" }
    volumes: [{ type: volume, source: shared, target: /var/lib/db }]
volumes:
  shared: {}
`);
    expect(HarborServices.parse(s)).toEqual(s);
    expect(s.volumes).toEqual(['shared']);
    expect(s.main).toEqual({
      dependsOn: [{ service: 'api', condition: 'service_healthy' }, { service: 'db', condition: 'service_started' }],
      mounts: [{ volume: 'shared', target: '/data', readOnly: false }],
      env: { API_URL: 'http://api:8000' },
    });
    const api = s.sidecars.find((x) => x.name === 'api')!;
    expect(api).toEqual({
      name: 'api',
      image: { from: 'build', context: 'environment/api', dockerfile: 'Dockerfile.dev', timeoutSec: 300 },
      entrypoint: ['/usr/bin/env'],
      command: ['python3', '-m', 'http.server', '8000', '--bind', '127.0.0.1'],
      env: { MODE: 'test', GREETING: 'hi there' },
      workdir: '/srv',
      user: '1000:1000',
      expose: [8000, 9000],
      healthcheck: { test: ['/bin/sh', '-c', 'curl -fs http://localhost:8000/ || exit 1'], intervalSec: 1, timeoutSec: 0.5, retries: 10, startPeriodSec: 90 },
      dependsOn: [{ service: 'db', condition: 'service_started' }],
      mounts: [{ volume: 'shared', target: '/srv/data', readOnly: true }],
    });
    const db = s.sidecars.find((x) => x.name === 'db')!;
    expect(db.image).toEqual({ from: 'main' });
    expect(db.healthcheck).toEqual({ test: ['/bin/sh', '-c', 'true'], intervalSec: 30, timeoutSec: 30, retries: 3, startPeriodSec: 0 });
    expect(db.mounts).toEqual([{ volume: 'shared', target: '/var/lib/db', readOnly: false }]);
  });

  it('interpolates ${VAR} and ${VAR:-default} from the enqueuing host, and Harbor\'s own names; $$ is a dollar', () => {
    const s = read(withApi('environment:\n  A: ${GREETING}\n  B: ${MISSING:-fallback}\n  C: "$$HOME"\n  D: ${CPUS}/${MEMORY}\n  E: $GREETING'), { GREETING: 'hello' });
    expect(s.sidecars[0]!.env).toEqual({ A: 'hello', B: 'fallback', C: '$HOME', D: '2/2048M', E: 'hello' });
    expect(refusal(withApi('environment: { A: "${MISSING}" }'))).toMatch(/services\.api\.environment\.A: \$\{MISSING\} is not set/);
  });

  it('durations and command strings as compose reads them', () => {
    expect(composeDuration('1m30s', 'x')).toBe(90);
    expect(composeDuration('250ms', 'x')).toBe(0.25);
    expect(composeDuration(5, 'x')).toBe(5);
    expect(() => composeDuration('soon', 'f')).toThrow(/f: a duration/);
    expect(shellWords(`sh -c 'echo "a b"' "c\\"d" e\\ f`, 'x')).toEqual(['sh', '-c', 'echo "a b"', 'c"d', 'e f']);
  });

  // The hostile corpus: [what, compose text, the message's pattern (service and key)].
  const HOSTILE: [string, string, RegExp][] = [
    ['privileged', withApi('privileged: true'), /services\.api\.privileged: refused/],
    ['privileged false still names the key', withApi('privileged: false'), /services\.api\.privileged: refused/],
    ['network_mode host', withApi('network_mode: host'), /services\.api\.network_mode: refused/],
    ['network_mode none', withApi('network_mode: none'), /services\.api\.network_mode: refused/],
    ['network_mode of another container', withApi('network_mode: "container:redis"'), /services\.api\.network_mode: refused/],
    ['network_mode service', withApi('network_mode: "service:main"'), /services\.api\.network_mode: refused/],
    ['main network_mode', 'services:\n  main:\n    network_mode: host\n  api: { image: x }\n', /services\.main\.network_mode: refused/],
    ['service networks', withApi('networks: [default]'), /services\.api\.networks: refused/],
    ['top-level networks', withApi('', 'networks:\n  outside: { external: true }\n'), /^networks: refused/],
    ['pid host', withApi('pid: host'), /services\.api\.pid: refused/],
    ['ipc host', withApi('ipc: host'), /services\.api\.ipc: refused/],
    ['uts host', withApi('uts: host'), /services\.api\.uts: refused/],
    ['userns_mode host', withApi('userns_mode: host'), /services\.api\.userns_mode: refused/],
    ['cgroup host', withApi('cgroup: host'), /services\.api\.cgroup: refused/],
    ['bind mount of an absolute host path', withApi('volumes: ["/etc:/host-etc"]'), /services\.api\.volumes\.0: "\/etc" is a host path/],
    ['bind mount of a relative path', withApi('volumes: ["./data:/data"]'), /services\.api\.volumes\.0: "\.\/data" is a host path/],
    ['bind mount of the home folder', withApi('volumes: ["~/.ssh:/keys:ro"]'), /services\.api\.volumes\.0: "~\/\.ssh" is a host path/],
    ['the Docker socket', withApi('volumes: ["/var/run/docker.sock:/var/run/docker.sock"]'), /services\.api\.volumes\.0: the Docker socket/],
    ['the Docker socket, long form', withApi('volumes: [{ type: bind, source: /run/docker.sock, target: /d.sock }]'), /services\.api\.volumes\.0: the Docker socket/],
    ['a long-form bind', withApi('volumes: [{ type: bind, source: /tmp, target: /t }]'), /services\.api\.volumes\.0\.type: only named volumes/],
    ['tmpfs mount', withApi('volumes: [{ type: tmpfs, target: /t }]'), /services\.api\.volumes\.0\.type: only named volumes/],
    ['an undeclared volume', withApi('volumes: ["nowhere:/x"]'), /services\.api\.volumes\.0: volume "nowhere" is not declared/],
    ['an anonymous volume', withApi('volumes: ["/cache"]'), /services\.api\.volumes\.0: "\/cache" is an anonymous volume/],
    ['a volume over /', withApi('volumes: ["v:/"]', 'volumes: { v: {} }\n'), /services\.api\.volumes\.0: the target must be an absolute folder other than \//],
    ['an external volume', withApi('volumes: ["v:/x"]', 'volumes:\n  v: { external: true }\n'), /volumes\.v: refused/],
    ['a volume with a driver', withApi('volumes: ["v:/x"]', 'volumes:\n  v: { driver: local, driver_opts: { type: none, device: /etc, o: bind } }\n'), /volumes\.v: refused/],
    ['devices', withApi('devices: ["/dev/kvm:/dev/kvm"]'), /services\.api\.devices: refused/],
    ['device cgroup rules', withApi('device_cgroup_rules: ["c 1:3 mr"]'), /services\.api\.device_cgroup_rules: refused/],
    ['cap_add SYS_ADMIN', withApi('cap_add: [SYS_ADMIN]'), /services\.api\.cap_add: "SYS_ADMIN" refused/],
    ['cap_add NET_ADMIN', withApi('cap_add: [CHOWN, NET_ADMIN]'), /services\.api\.cap_add: "NET_ADMIN" refused/],
    ['cap_add ALL', withApi('cap_add: [ALL]'), /services\.api\.cap_add: "ALL" refused/],
    ['cap_add NET_RAW (dropped from the main sandbox too)', withApi('cap_add: [CAP_NET_RAW]'), /services\.api\.cap_add: "NET_RAW" refused/],
    ['security_opt unconfined', withApi('security_opt: ["seccomp:unconfined"]'), /services\.api\.security_opt: refused/],
    ['security_opt apparmor', withApi('security_opt: ["apparmor=unconfined"]'), /services\.api\.security_opt: refused/],
    ['sysctls', withApi('sysctls: { net.ipv4.ip_forward: 1 }'), /services\.api\.sysctls: refused/],
    ['published ports', withApi('ports: ["8000:8000"]'), /services\.api\.ports: refused/],
    ['published ports on main', 'services:\n  main:\n    ports: ["127.0.0.1:2222:22"]\n  api: { image: x }\n', /services\.main\.ports: refused/],
    ['volumes_from', withApi('volumes_from: [main]'), /services\.api\.volumes_from: refused/],
    ['extends', withApi('extends: { file: ../../other.yaml, service: x }'), /services\.api\.extends: refused/],
    ['env_file', withApi('env_file: [../../../.env]'), /services\.api\.env_file: refused/],
    ['env_file inside the folder too', withApi('env_file: .env'), /services\.api\.env_file: refused/],
    ['secrets', withApi('secrets: [token]'), /services\.api\.secrets: refused/],
    ['top-level secrets', withApi('', 'secrets:\n  k: { file: /etc/shadow }\n'), /^secrets: refused/],
    ['top-level configs', withApi('', 'configs:\n  k: { file: /etc/passwd }\n'), /^configs: refused/],
    ['include', withApi('', 'include: [../other.yaml]\n'), /^include: refused/],
    ['extra_hosts', withApi('extra_hosts: ["redis:172.17.0.1"]'), /services\.api\.extra_hosts: refused/],
    ['dns', withApi('dns: 8.8.8.8'), /services\.api\.dns: refused/],
    ['links outside', withApi('external_links: [redis]'), /services\.api\.external_links: refused/],
    ['ulimits', withApi('ulimits: { nproc: 1000000 }'), /services\.api\.ulimits: refused/],
    ['shm_size', withApi('shm_size: 64g'), /services\.api\.shm_size: refused/],
    ['a runtime', withApi('runtime: runc'), /services\.api\.runtime: refused/],
    ['oom_kill_disable', withApi('oom_kill_disable: true'), /services\.api\.oom_kill_disable: refused/],
    ['cgroup_parent', withApi('cgroup_parent: /'), /services\.api\.cgroup_parent: refused/],
    ['an unknown key', withApi('gpus: all'), /services\.api\.gpus: refused/],
    ['a key compose has and the fleet does not', withApi('storage_opt: { size: 1T }'), /services\.api\.storage_opt: refused/],
    ['something else unknown', withApi('annotations: { a: b }'), /services\.api\.annotations: not supported/],
    ['a secret read by ${VAR}', withApi('environment: { K: "${MODEL_API_KEY}" }'), /services\.api\.environment\.K: \$\{MODEL_API_KEY\} would read a secret/],
    ['a token read by ${VAR}', withApi('command: ["echo", "${GITHUB_TOKEN:-x}"]'), /services\.api\.command\.1: \$\{GITHUB_TOKEN\} would read a secret/],
    ['a fleet setting read by ${VAR}', withApi('environment: ["R=${REDIS_URL}"]'), /services\.api\.environment\.0: \$\{REDIS_URL\} would read a secret or a setting/],
    ['a fleet setting read by $VAR', withApi('environment: ["R=$FLEET_DASHBOARD_PASSWORD"]'), /\$\{FLEET_DASHBOARD_PASSWORD\} would read a secret/],
    ['a secret in a volume name', withApi('volumes: ["${AWS_SECRET_ACCESS_KEY}:/x"]'), /\$\{AWS_SECRET_ACCESS_KEY\} would read a secret/],
    ['a host value passed by name', withApi('environment: [HOME]'), /services\.api\.environment\.HOME: no value/],
    ['a host value passed by a null', withApi('environment: { HOME: null }'), /services\.api\.environment\.HOME: no value/],
    ['a bind mount of the task folder', withApi('volumes: ["${CONTEXT_DIR}/data:/data"]'), /services\.api\.volumes\.0: "\$\{CONTEXT_DIR\}\/data" is a host path/],
    ['a build context outside the task', withApi('build: { context: ../.. }'), /services\.api\.build\.context: "\.\.\/\.\." is outside the task's environment\/ folder/],
    ['a build context at a host path', withApi('build: /etc'), /services\.api\.build\.context: "\/etc" is outside/],
    ['a Dockerfile outside the context', withApi('build: { context: ./api, dockerfile: ../../../Dockerfile }'), /services\.api\.build\.dockerfile: "\.\.\/\.\.\/\.\.\/Dockerfile" is outside the build context/],
    ['a missing Dockerfile', withApi('build: ./nothing'), /services\.api\.build: "environment\/nothing\/Dockerfile" is not in the task folder/],
    ['build args', withApi('build: { context: ./api, args: { TOKEN: x } }'), /services\.api\.build\.args: refused/],
    ['build with the host network', withApi('build: { context: ./api, network: host }'), /services\.api\.build\.network: refused/],
    ['build secrets', withApi('build: { context: ./api, secrets: [k] }'), /services\.api\.build\.secrets: refused/],
    ['main with another image', 'services:\n  main: { image: "alpine:3.21" }\n  api: { image: x }\n', /services\.main\.image: main's image is the task's/],
    ['main built elsewhere', 'services:\n  main: { build: ./api }\n  api: { image: x }\n', /services\.main\.build: main is built from environment\/Dockerfile/],
    ['main privileged', 'services:\n  main: { privileged: true }\n  api: { image: x }\n', /services\.main\.privileged: refused/],
    ['main working_dir', 'services:\n  main: { working_dir: /x }\n  api: { image: x }\n', /services\.main\.working_dir: main's working folder is task\.toml's/],
    ['depends_on a missing service', withApi('depends_on: [ghost]'), /services\.api\.depends_on: "ghost" is not a service/],
    ['depends_on main', withApi('depends_on: [main]'), /services\.api\.depends_on: main starts after every sidecar/],
    ['a dependency cycle', 'services:\n  main: {}\n  a: { image: x, depends_on: [b] }\n  b: { image: x, depends_on: [a] }\n', /a cycle \((a -> b -> a|b -> a -> b)\)/],
    ['service_healthy without a healthcheck', withApi('', '').replace('  main: {}', '  main: { depends_on: { api: { condition: service_healthy } } }'), /services\.main\.depends_on\.api: condition service_healthy, and api has no healthcheck/],
    ['an unknown condition', 'services:\n  main: { depends_on: { api: { condition: service_completed_successfully } } }\n  api: { image: x }\n', /services\.main\.depends_on\.api\.condition: service_started or service_healthy/],
    ['a service without an image', 'services:\n  main: {}\n  api: { command: "true" }\n', /services\.api: needs image: or build:/],
    ['no sidecar at all', 'services:\n  main: {}\n', /no service beside main/],
    ['not YAML', 'services: [\n', /^not valid YAML/],
    ['not a mapping', '- a\n- b\n', /not a mapping/],
    ['an alias bomb', `a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [${Array(9).fill('*a').join(',')}]\nc: &c [${Array(9).fill('*b').join(',')}]\nd: &d [${Array(9).fill('*c').join(',')}]\nservices: { main: {}, api: { image: x, command: *d } }\n`, /^not valid YAML/],
    ['a user for main', 'services:\n  main: { user: root }\n  api: { image: x }\n', /services\.main\.user: not supported/],
    ['a bad service name', 'services:\n  main: {}\n  "Bad Name": { image: x }\n', /a service name is lower-case/],
    ['a bad healthcheck test', withApi('healthcheck: { test: ["RUN", "x"] }'), /services\.api\.healthcheck\.test: \["CMD"/],
    ['a bad duration', withApi('healthcheck: { test: "true", interval: soon }'), /services\.api\.healthcheck\.interval: a duration/],
    ['a published port range by expose', withApi('expose: ["8000-9000"]'), /services\.api\.expose\.0: a port/],
  ];
  for (const [what, text, pattern] of HOSTILE) {
    it(`refuses ${what}`, () => {
      const message = refusal(text);
      expect(message).toMatch(pattern);
      // Never the file's content beyond the value named.
      expect(message).not.toContain('\n');
    });
  }

  it('accepts the capabilities the main sandbox already has, cap_drop and a read-only root', () => {
    const s = read(withApi('cap_add: [CHOWN, CAP_KILL]\ncap_drop: [ALL]\nread_only: true'));
    expect(s.sidecars[0]!.name).toBe('api');
  });

  it('healthcheck disabled leaves none', () => {
    expect(read(withApi('healthcheck: { disable: true }')).sidecars[0]!.healthcheck).toBeUndefined();
    expect(read(withApi('healthcheck: { test: ["NONE"] }')).sidecars[0]!.healthcheck).toBeUndefined();
  });
});

describe('the task-service fixtures', () => {
  it('load with their services, and the sidecars\' worst-case healthchecks and builds in the set-up reserve', async () => {
    const { loadTask } = await import('../../src/tasks/load-task.ts');
    const path = await import('node:path');
    const dir = path.resolve(import.meta.dirname, '../fixtures/harbor-services');
    const api = (await loadTask(path.join(dir, 'api-sidecar'))).spec;
    expect(api.harbor?.services?.main).toEqual({ dependsOn: [{ service: 'api', condition: 'service_healthy' }], mounts: [], env: { API_URL: 'http://api:8000' } });
    expect(api.harbor?.services?.sidecars.map((s) => s.name)).toEqual(['api']);
    expect(api.reserves.setupSec).toBeGreaterThanOrEqual(30 * 4);
    const shared = (await loadTask(path.join(dir, 'shared-volume'))).spec;
    expect(shared.harbor?.services?.volumes).toEqual(['shared']);
    expect(shared.harbor?.services?.main.mounts).toEqual([{ volume: 'shared', target: '/shared', readOnly: true }]);
    const built = (await loadTask(path.join(dir, 'built-sidecar'))).spec;
    expect(built.harbor?.services?.sidecars[0]!.image).toEqual({ from: 'build', context: 'environment/calc', dockerfile: 'Dockerfile', timeoutSec: 300 });
  });
});
