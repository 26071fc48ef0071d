// Terminal-Bench 1's mapping: the pytest-summary grader (run with this machine's awk, as the sandbox's
// awk runs it), the compose file's client service read or refused by service and key, and the folder
// mapped to Harbor's layout.
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, writeFile, mkdir, readdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { loadTask } from '../../src/tasks/load-task.ts';
import { TB1_GRADER_AWK, readTb1Compose, tb1SolutionScript } from '../../src/tasks/terminal-bench-1.ts';

const run = promisify(execFile);
const FIXTURES = path.join(import.meta.dirname, '../fixtures/terminal-bench-1');

async function grade(output: string): Promise<unknown> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-tb1-grade-'));
  await writeFile(path.join(dir, 'out.txt'), output);
  await run('awk', ['-v', `out=${path.join(dir, 'reward.json')}`, TB1_GRADER_AWK, path.join(dir, 'out.txt')]);
  return readFile(path.join(dir, 'reward.json'), 'utf8').then((t) => JSON.parse(t), () => undefined);
}

const summary = (lines: string[]) => ['============================= test session starts ==============================', 'collected 3 items', '', 'tests/test_outputs.py .F.', '=========================== short test summary info ============================', ...lines, '========================= 1 failed, 2 passed in 0.05s ========================='].join('\n');

describe('the pytest-summary grader', () => {
  it('solves a task when every listed test passed, SKIPPED and XFAIL counting as passed', async () => {
    expect(await grade(summary(['PASSED tests/test_outputs.py::test_a', 'SKIPPED [1] tests/test_outputs.py:9: no gpu', 'XFAIL tests/test_outputs.py::test_c - known']))).toEqual({ reward: 1, tests_passed: 3, tests_total: 3 });
  });

  it('fails it on any FAILED, ERROR or XPASS, and counts what passed', async () => {
    expect(await grade(summary(['PASSED tests/test_outputs.py::test_a', 'FAILED tests/test_outputs.py::test_b - assert 1 == 2', 'PASSED tests/test_outputs.py::test_c']))).toEqual({ reward: 0, tests_passed: 2, tests_total: 3 });
    expect(await grade(summary(['ERROR tests/test_outputs.py::test_a - ImportError']))).toEqual({ reward: 0, tests_passed: 0, tests_total: 1 });
    expect(await grade(summary(['XPASS tests/test_outputs.py::test_a']))).toEqual({ reward: 0, tests_passed: 0, tests_total: 1 });
  });

  it('reads only after the summary line: PASSED lines of the verbose run before it do not count', async () => {
    const out = ['tests/test_outputs.py::test_a PASSED', 'PASSED tests/test_outputs.py::test_fake', summary(['FAILED tests/test_outputs.py::test_a - no'])].join('\n');
    expect(await grade(out)).toEqual({ reward: 0, tests_passed: 0, tests_total: 1 });
  });

  it('writes nothing when there is no summary, or a summary naming no test (the episode is then an error)', async () => {
    expect(await grade('ImportError while loading conftest\n')).toBeUndefined();
    expect(await grade('=== short test summary info ===\n=== no tests ran in 0.01s ===\n')).toBeUndefined();
    expect(await grade('')).toBeUndefined();
  });
});

describe('the compose file of a Terminal-Bench 1 task', () => {
  const template = () => ({
    services: {
      client: {
        build: { dockerfile: 'Dockerfile' }, image: '${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}', container_name: '${T_BENCH_TASK_DOCKER_CLIENT_CONTAINER_NAME}',
        command: ['sh', '-c', 'sleep infinity'], environment: ['TEST_DIR=${T_BENCH_TEST_DIR}', 'PASSED_THROUGH'],
        volumes: ['${T_BENCH_TASK_LOGS_PATH}:${T_BENCH_CONTAINER_LOGS_PATH}', '${T_BENCH_TASK_AGENT_LOGS_PATH}:${T_BENCH_CONTAINER_AGENT_LOGS_PATH}'],
      },
    },
  });

  it('reads the template: the build, the environment with Terminal-Bench\'s values (a bare name passes nothing of the host)', () => {
    expect(readTb1Compose(template())).toEqual({ service: 'client', build: { context: '.', dockerfile: 'Dockerfile' }, environment: [['TEST_DIR', '/tests']] });
  });

  it('takes the services beside the client as sidecars: Terminal-Bench\'s variables filled in, names and networks dropped', () => {
    const c = template();
    const read = readTb1Compose({
      services: {
        client: { ...c.services.client, depends_on: ['db'], networks: ['t'], volumes: [...c.services.client.volumes, 'data:/data'] },
        db: { image: '${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}', container_name: '${T_BENCH_TASK_DOCKER_NAME_PREFIX}__db', networks: ['t'], environment: { LOGS: '${T_BENCH_CONTAINER_LOGS_PATH}', OTHER: '${HOME:-x}' }, volumes: ['${T_BENCH_TASK_LOGS_PATH}:/logs', 'data:/var/db'] },
      },
      networks: { t: {} },
      volumes: { data: {} },
    });
    expect(read).toMatchObject({ service: 'client', dependsOn: ['db'], volumes: ['data:/data'], namedVolumes: { data: {} } });
    expect(read.sidecars).toEqual({ db: { image: '${MAIN_IMAGE_NAME}', environment: { LOGS: '/logs', OTHER: '${HOME:-x}' }, volumes: ['data:/var/db'] } });
  });

  const refusals: [string, (c: ReturnType<typeof template>) => unknown, RegExp][] = [
    ['privileged', (c) => ({ ...c, services: { client: { ...c.services.client, privileged: true } } }), /services\.client\.privileged: not supported/],
    ['cap_add', (c) => ({ ...c, services: { client: { ...c.services.client, cap_add: ['SYS_ADMIN'] } } }), /services\.client\.cap_add/],
    ['network_mode host', (c) => ({ ...c, services: { client: { ...c.services.client, network_mode: 'host' } } }), /services\.client\.network_mode/],
    ['published ports', (c) => ({ ...c, services: { client: { ...c.services.client, ports: ['8080:80'] } } }), /services\.client\.ports/],
    ['a host path', (c) => ({ ...c, services: { client: { ...c.services.client, volumes: ['/var/run/docker.sock:/var/run/docker.sock'] } } }), /services\.client\.volumes\.0: .*docker\.sock.*only Terminal-Bench's own log mounts/],
    ['several services and none is the client', () => ({ services: { web: { image: 'a' }, db: { image: 'postgres' } } }), /services: web, db: no `client` service/],
    ['a service named main beside the client', (c) => ({ services: { ...c.services, main: { image: 'a' } } }), /services\.main: the agent's container is `main`/],
    ['a volume that is neither a log mount nor named', (c) => ({ services: { client: { ...c.services.client, volumes: ['./data:/data'] } } }), /services\.client\.volumes\.0: .*only Terminal-Bench's own log mounts and named volumes/],
    ['a build context outside the folder', (c) => ({ services: { client: { ...c.services.client, build: { context: '../..' } } } }), /build\.context: "\.\.\/\.\." is outside the task folder/],
    ['build args', (c) => ({ services: { client: { ...c.services.client, build: { context: '.', args: { A: '1' } } } } }), /build\.args: not supported/],
    ['a variable of the host', (c) => ({ services: { client: { ...c.services.client, environment: ['KEY=${OPENAI_API_KEY}'] } } }), /environment\.0: \$\{OPENAI_API_KEY\} is not a Terminal-Bench variable/],
    ['top-level configs', (c) => ({ ...c, configs: { x: {} } }), /^configs: not supported/],
    ['the template image without a build', (c) => ({ services: { client: { image: c.services.client.image } } }), /services\.client\.build: missing/],
  ];
  for (const [what, make, message] of refusals) {
    it(`refuses ${what}, naming the service and the key`, () => {
      expect(() => readTb1Compose(make(template()))).toThrow(message);
    });
  }
});

describe('mapping a folder', () => {
  it('gives Harbor\'s layout: the Dockerfile with the service\'s environment, tests/ with run-tests.sh and our grader, the solution', async () => {
    const task = await loadTask(path.join(FIXTURES, 'count-words'));
    expect(task.from).toBe(path.join(FIXTURES, 'count-words'));
    expect(task.spec).toMatchObject({ id: 'count-words', verify: { timeoutSec: 60 }, harbor: { build: { timeoutSec: 600 }, workdirFromImage: true, verifierEnv: { TEST_DIR: '/tests' } } });
    expect((await readdir(task.dir)).sort()).toEqual(['environment', 'instruction.md', 'solution', 'task.toml', 'tests']);
    expect((await readdir(path.join(task.dir, 'tests'))).sort()).toEqual(['run-tests.sh', 'test.sh', 'test_outputs.py']);
    expect(await readdir(path.join(task.dir, 'environment'))).not.toContain('docker-compose.yaml');
    const dockerfile = await readFile(path.join(task.dir, 'environment', 'Dockerfile'), 'utf8');
    expect(dockerfile).toMatch(/^FROM ghcr\.io\/laude-institute\/t-bench\/python-3-13:20250620$/m);
    expect(dockerfile).toMatch(/^ENV WORDS_FILE="\/app\/words\.txt"$/m);
    // Loading again reuses the mapped folder; the task's own folder is never written.
    expect((await loadTask(path.join(FIXTURES, 'count-words'))).dir).toBe(task.dir);
    expect((await readdir(path.join(FIXTURES, 'count-words'))).sort()).toEqual(['Dockerfile', 'docker-compose.yaml', 'run-tests.sh', 'solution.sh', 'task.yaml', 'tests', 'words.txt']);
  });

  it('writes the services beside the client into environment/docker-compose.yaml, the client as main', async () => {
    const task = await loadTask(path.join(FIXTURES, 'with-server'));
    const compose = await readFile(path.join(task.dir, 'environment', 'docker-compose.yaml'), 'utf8');
    expect(compose).toMatch(/^services:\n {2}main:\n {4}depends_on:\n {6}server:\n {8}condition: service_healthy$/m);
    expect(compose).toMatch(/^ {2}server:\n {4}build:\n {6}context: \.\/server$/m);
    expect(compose).not.toMatch(/networks|container_name/);
    expect(task.spec.harbor?.services?.sidecars.map((s) => s.name)).toEqual(['server']);
    expect(task.spec.harbor?.services?.main.dependsOn).toEqual([{ service: 'server', condition: 'service_healthy' }]);
  });

  it('names the file and the field of what is wrong', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-tb1-bad-'));
    await mkdir(path.join(dir, 'tests'));
    await writeFile(path.join(dir, 'run-tests.sh'), 'true\n');
    await writeFile(path.join(dir, 'docker-compose.yaml'), 'services:\n  client:\n    image: ubuntu:24.04\n');
    await writeFile(path.join(dir, 'task.yaml'), 'instruction: x\nparser_name: swebench\n');
    await expect(loadTask(dir)).rejects.toThrow(/task\.yaml: parser_name: only "pytest" is supported/);
    await writeFile(path.join(dir, 'task.yaml'), 'instruction: x\nmax_agent_timeout_sec: -5\n');
    await expect(loadTask(dir)).rejects.toThrow(/task\.yaml: max_agent_timeout_sec: /);
    await writeFile(path.join(dir, 'task.yaml'), 'instruction: x\n');
    await writeFile(path.join(dir, 'docker-compose.yaml'), 'services:\n  client:\n    image: ubuntu:24.04\n    privileged: true\n');
    await expect(loadTask(dir)).rejects.toThrow(/docker-compose\.yaml: services\.client\.privileged: not supported/);
  });

  it('takes an early task.yaml\'s base description as the instruction', async () => {
    const dir = await mkdtemp(path.join(os.tmpdir(), 'rf-tb1-old-'));
    await mkdir(path.join(dir, 'tests'));
    await writeFile(path.join(dir, 'run-tests.sh'), 'true\n');
    await writeFile(path.join(dir, 'docker-compose.yaml'), 'services:\n  client:\n    image: ubuntu:24.04\n');
    await writeFile(path.join(dir, 'task.yaml'), 'descriptions:\n  - key: hard\n    description: terse\n  - key: base\n    description: Print the date.\n');
    expect((await loadTask(dir)).spec.instruction).toBe('Print the date.\n');
  });

  it('types solution.yaml\'s keystrokes into one bash, Enter where it says', () => {
    const script = tb1SolutionScript([{ command: 'echo a', append_enter: true }, { command: 'echo b', append_enter: false }, { command: 'c', append_enter: true }]);
    expect(script).toContain('echo a\necho bc\n');
    expect(script).toMatch(/^bash <<'ROLLOUT_FLEET_KEYSTROKES_[0-9a-f]{16}'$/m);
  });
});
