// Harbor task folders loaded as the fleet's TaskSpec: every fixture under test/fixtures/harbor loads,
// its fields land where Harbor puts them, and a corpus of broken folders is refused with messages
// that name the file and the field, never the file's content.
import { cp, mkdtemp, rm, symlink, writeFile, mkdir } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { aggregateSteps, missedGate } from '../../src/episode/harbor-steps.ts';
import { FleetError } from '../../src/errors/fleet-error.ts';
import { HARBOR_BUILT_IMAGE, stripCanary } from '../../src/tasks/harbor-task.ts';
import { loadBatchObject, loadTask } from '../../src/tasks/load-task.ts';
import { HARBOR_TEST_COMMAND, agentCeilingSec } from '../../src/tasks/task-spec.ts';

const FIXTURES = path.resolve(import.meta.dirname, '../fixtures/harbor');

let scratch: string;
beforeAll(async () => {
  scratch = await mkdtemp(path.join(os.tmpdir(), 'rf-harbor-unit-'));
});
afterAll(async () => {
  await rm(scratch, { recursive: true, force: true });
});

const SEPARATE = path.join(FIXTURES, '..', 'harbor-separate');
const STEPS = path.join(FIXTURES, '..', 'harbor-steps');

/** A copy of a fixture to break, with `edit` applied. */
async function variant(name: string, fixture: string, edit: (dir: string) => Promise<void>): Promise<string> {
  const dir = path.join(scratch, name);
  await cp(path.join(FIXTURES, fixture), dir, { recursive: true });
  await edit(dir);
  return dir;
}

async function problemsOf(dir: string, hostEnv: Record<string, string> = {}): Promise<string> {
  try {
    await loadTask(dir, {}, hostEnv);
  } catch (err) {
    expect(err).toBeInstanceOf(FleetError);
    expect((err as FleetError).code).toBe('invalid_task');
    return (err as Error).message;
  }
  throw new Error(`${dir} loaded, but should have been refused`);
}

describe('Harbor task folders', () => {
  it('loads a Terminal-Bench 2.0 style task.toml (version, deprecated memory and storage) as Harbor runs it', async () => {
    const { spec } = await loadTask(path.join(FIXTURES, 'hello-file'));
    expect(spec.id).toBe('hello-file');
    expect(spec.instruction).toBe('Create a file `/app/greeting.txt` whose only line is `Hello from the fleet`.\n');
    expect(spec.image).toBe(HARBOR_BUILT_IMAGE);
    expect(spec.verify).toEqual({ command: HARBOR_TEST_COMMAND, timeoutSec: 60 });
    expect(spec.limits).toMatchObject({ memoryMb: 1024, diskMb: 2048, cpus: 1 });
    expect(agentCeilingSec(spec)).toBe(120);
    expect(spec.harbor).toMatchObject({
      schemaVersion: '1.0', build: { timeoutSec: 300 }, uploadEnvironment: false, workdirFromImage: true,
      network: { agent: 'public', verifier: 'public' },
    });
  });

  it('resolves a separate verifier: built from tests/, or its docker_image, or the agent\'s image; its reserve covers the hooks', async () => {
    const own = (await loadTask(path.join(SEPARATE, 'own-image'))).spec;
    expect(own.harbor).toMatchObject({ separateVerifier: { build: { timeoutSec: 300 }, env: {}, limits: { memoryMb: 512 } }, artifacts: [{ source: '/app/answer.txt' }], collect: [] });
    expect(own.reserves.verifySec).toBe(60 + 10 + 30);
    const fresh = (await loadTask(path.join(SEPARATE, 'fresh-copy'))).spec;
    expect(fresh.harbor?.separateVerifier).toEqual({ env: {}, limits: {} });
    expect(fresh.harbor?.collect).toEqual([{ command: 'cp /app/state.json /logs/artifacts/state.json', timeoutSec: 10 }]);
    expect(fresh.reserves.verifySec).toBe(60 + 10 + 30 + 10);
    expect((await loadTask(path.join(FIXTURES, 'hello-file'))).spec.harbor?.separateVerifier).toBeUndefined();
  });

  it('resolves a multi-step task: each step\'s instruction and timeouts, the sums as the episode\'s, the gates', async () => {
    const { spec } = await loadTask(path.join(STEPS, 'two-steps'));
    expect(spec.harbor?.steps?.map((st) => [st.name, st.agentTimeoutSec, st.verifierTimeoutSec, st.has])).toEqual([
      ['one', 60, 30, { workdir: true, setup: true, tests: true, solution: true }],
      ['two', 45, 30, { workdir: false, setup: false, tests: true, solution: true }],
    ]);
    expect(spec.harbor?.stepStrategy).toBe('final');
    expect(agentCeilingSec(spec)).toBe(60 + 45);
    expect(spec.reserves.verifySec).toBe(2 * (30 + 10));
    expect(spec.instruction).toMatch(/plus one/);
    const gated = (await loadTask(path.join(STEPS, 'gated-three'))).spec;
    expect(gated.harbor?.steps?.map((st) => st.minReward)).toEqual([undefined, { reward: 1 }, undefined]);
    expect(gated.harbor?.stepStrategy).toBe('mean');
  });

  it('takes docker_image, workdir, users, env tables and the healthcheck', async () => {
    const prebuilt = (await loadTask(path.join(FIXTURES, 'prebuilt-image'))).spec;
    expect(prebuilt.image).toBe('python:3.12-slim');
    expect(prebuilt.workdir).toBe('/data');
    expect(prebuilt.harbor).toMatchObject({ dockerImage: 'python:3.12-slim', uploadEnvironment: true, workdirFromImage: false });
    expect(prebuilt.harbor?.build).toBeUndefined();

    expect((await loadTask(path.join(FIXTURES, 'non-root-agent'))).spec.harbor?.agentUser).toBe('builder');

    const env = (await loadTask(path.join(FIXTURES, 'env-vars'))).spec.harbor!;
    expect(env.env).toEqual({ GREETING: 'hello-harbor' });
    expect((await loadTask(path.join(FIXTURES, 'env-vars'), {}, { GREETING_SUFFIX: 'host' })).spec.harbor?.env).toEqual({ GREETING: 'hello-host' });
    expect(env.verifierEnv).toEqual({ EXPECTED: 'hello-harbor' });
    expect(env.solutionEnv).toEqual({ SOLVER_MARK: 'solved' });

    const server = (await loadTask(path.join(FIXTURES, 'healthy-server'))).spec;
    expect(server.harbor?.healthcheck).toMatchObject({ intervalSec: 1, timeoutSec: 5, startPeriodSec: 2, retries: 20 });
    // The healthcheck's worst case is added to the set-up reserve: 60 + 2 + 20 * (1 + 5).
    expect(server.reserves.setupSec).toBe(182);
  });

  it('reads ${VAR} from the enqueuing host, with defaults, and refuses a missing one by name', async () => {
    const dir = await variant('env-host', 'env-vars', async (d) => {
      await writeFile(path.join(d, 'task.toml'), '[environment]\n[environment.env]\nLANGUAGE = "${TASK_LANG}"\nPLAIN = "x"\n');
    });
    expect((await loadTask(dir, {}, { TASK_LANG: 'fr' })).spec.harbor?.env).toEqual({ LANGUAGE: 'fr', PLAIN: 'x' });
    expect(await problemsOf(dir)).toContain('task.toml: environment.env.LANGUAGE: ${TASK_LANG} is not set where the batch was enqueued');
  });

  it('never reads a secret or a fleet setting into the sandbox', async () => {
    for (const name of ['MODEL_API_KEY', 'REDIS_URL', 'GITHUB_TOKEN', 'AWS_REGION']) {
      const dir = await variant(`secret-${name}`, 'env-vars', (d) => writeFile(path.join(d, 'task.toml'), `[verifier.env]\nX = "\${${name}:-fallback}"\n`));
      const message = await problemsOf(dir, { [name]: 'the-secret-value' });
      expect(message).toContain(`task.toml: verifier.env.X: \${${name}} would read a secret or a setting of the fleet`);
      expect(message).not.toContain('the-secret-value');
    }
  });

  it('strips canary lines and the blank lines after them, and nothing else', () => {
    expect(stripCanary('<!-- harbor-canary GUID x -->\n# canary: do not train\n\nDo the task.\n# not a canary\n')).toBe('Do the task.\n# not a canary\n');
    expect(stripCanary('Do it.\n<!-- canary -->\n')).toBe('Do it.\n<!-- canary -->\n');
  });

  it('finds Harbor tasks in a dataset folder, mixed with the fleet\'s own tasks in one batch', async () => {
    const repo = path.resolve(FIXTURES, '../../..');
    const batch = await loadBatchObject(
      { name: 'mixed', tasks: ['test/fixtures/harbor', 'examples/tasks/sum-column'], agent: { kind: 'oracle' } },
      { file: 'batch.yaml', base: repo, hostEnv: {} },
    );
    const ids = batch.tasks.map((t) => t.spec.id);
    expect(ids).toContain('hello-file');
    expect(ids).toContain('two-metrics');
    expect(ids).toHaveLength(18);
    const ours = batch.tasks.find((t) => t.dir?.endsWith('sum-column'));
    expect(ours?.spec.harbor).toBeUndefined();
    expect(ours?.spec.verify.command).not.toBe(HARBOR_TEST_COMMAND);
  });
});

describe('broken Harbor task folders are refused, naming the file and the field', () => {
  const cases: Array<[string, (dir: string) => Promise<void>, string]> = [
    ['malformed TOML', (d) => writeFile(path.join(d, 'task.toml'), '[agent\ntimeout_sec = 1\n'), 'task.toml: not valid TOML'],
    ['a wrong type', (d) => writeFile(path.join(d, 'task.toml'), '[agent]\ntimeout_sec = "soon"\n'), 'task.toml: agent.timeout_sec:'],
    ['a negative timeout', (d) => writeFile(path.join(d, 'task.toml'), '[verifier]\ntimeout_sec = -5\n'), 'task.toml: verifier.timeout_sec:'],
    ['a huge timeout', (d) => writeFile(path.join(d, 'task.toml'), '[agent]\ntimeout_sec = 1e12\n'), 'task.toml: agent.timeout_sec:'],
    ['a GPU', (d) => writeFile(path.join(d, 'task.toml'), '[environment]\ngpus = 1\n'), 'task.toml: environment.gpus: this fleet\'s sandboxes have no GPUs (got 1)'],
    ['Windows', (d) => writeFile(path.join(d, 'task.toml'), '[environment]\nos = "windows"\n'), 'task.toml: environment.os: only "linux" runs here (got "windows")'],
    ['an MCP server', (d) => writeFile(path.join(d, 'task.toml'), '[[environment.mcp_servers]]\nname = "x"\ntransport = "stdio"\ncommand = "x"\n'), 'task.toml: environment.mcp_servers: MCP servers beside the agent are not supported (got 1)'],
    ['a step without its folder', (d) => writeFile(path.join(d, 'task.toml'), '[[steps]]\nname = "one"\n'), 'task.toml: steps.0.name: no folder steps/one/'],
    ['a step without an instruction', async (d) => {
      await mkdir(path.join(d, 'steps', 'one'), { recursive: true });
      await writeFile(path.join(d, 'task.toml'), '[[steps]]\nname = "one"\n');
    }, 'steps/one: instruction.md: missing'],
    ['a step name that is a path', (d) => writeFile(path.join(d, 'task.toml'), '[[steps]]\nname = "../up"\n'), 'task.toml: steps.0.name: a step name'],
    ['a step with artifacts of its own', async (d) => {
      await mkdir(path.join(d, 'steps', 'one'), { recursive: true });
      await writeFile(path.join(d, 'steps', 'one', 'instruction.md'), 'x\n');
      await writeFile(path.join(d, 'task.toml'), '[verifier]\nenvironment_mode = "separate"\n\n[[steps]]\nname = "one"\nartifacts = ["/app/x"]\n');
    }, 'task.toml: steps.0.artifacts: per-step artifacts are not supported yet (got 1)'],
    ['a shared verifier with an environment of its own', async (d) => {
      await writeFile(path.join(d, 'tests', 'Dockerfile'), 'FROM ubuntu:24.04\n');
      await writeFile(path.join(d, 'task.toml'), '[verifier]\nenvironment_mode = "shared"\n');
    }, 'task.toml: verifier.environment_mode: "shared" with a verifier environment'],
    ['an artifact of a sidecar', (d) => writeFile(path.join(d, 'task.toml'), 'artifacts = [{ source = "/data", service = "db" }]\n'), 'task.toml: artifacts.0.service: no such task service (got "db"; the task has no environment/docker-compose.yaml services)'],
    ['a relative artifact', (d) => writeFile(path.join(d, 'task.toml'), 'artifacts = ["out.txt"]\n'), 'task.toml: artifacts.0.source: an absolute path in the agent\'s container (got "out.txt")'],
    ['a collect hook of a sidecar', (d) => writeFile(path.join(d, 'task.toml'), '[[verifier.collect]]\ncommand = "true"\nservice = "db"\n'), 'task.toml: verifier.collect.0.service: no such task service (got "db"'],
    ['a collect hook of a service the compose file lacks', async (d) => {
      await writeFile(path.join(d, 'environment', 'docker-compose.yaml'), 'services:\n  api:\n    image: python:3.12-slim\n');
      await writeFile(path.join(d, 'task.toml'), '[[verifier.collect]]\ncommand = "true"\nservice = "cache"\n');
    }, 'task.toml: verifier.collect.0.service: no such task service (got "cache"; its services are main, api)'],
    ['task services without services', (d) => writeFile(path.join(d, 'environment', 'docker-compose.yaml'), 'services: {}\n'), 'environment/: docker-compose.yaml: services: a map of services'],
    ['no image at all', (d) => rm(path.join(d, 'environment', 'Dockerfile')), 'environment/: Dockerfile: missing, and task.toml sets no environment.docker_image'],
    ['no test.sh', (d) => rm(path.join(d, 'tests', 'test.sh')), 'tests/: test.sh: missing'],
    ['a bad docker_image', (d) => writeFile(path.join(d, 'task.toml'), '[environment]\ndocker_image = "../../evil host:80/x"\n'), 'task.toml: harbor.dockerImage: not a valid image reference'],
    ['a workdir in the fleet\'s folders', (d) => writeFile(path.join(d, 'task.toml'), '[environment]\nworkdir = "/opt/rollout-fleet/x"\n'), 'task.toml: workdir: must not be in /opt/rollout-fleet'],
    ['a task.toml that is a link out of the folder', async (d) => {
      await rm(path.join(d, 'task.toml'));
      await symlink('/etc/passwd', path.join(d, 'task.toml'));
    }, 'task.toml: not a regular file (a symbolic link'],
    ['an empty instruction', (d) => writeFile(path.join(d, 'instruction.md'), '<!-- canary -->\n\n'), 'instruction.md: empty (after its canary lines)'],
    ['a huge instruction', (d) => writeFile(path.join(d, 'instruction.md'), 'x'.repeat(200 * 1024)), 'instruction.md: at most 65536 bytes (got 204800 bytes)'],
    ['an instruction larger than any page of settings', (d) => writeFile(path.join(d, 'instruction.md'), 'x'.repeat(2 * 1024 * 1024)), 'instruction.md: larger than 1048576 bytes'],
    ['no instruction', (d) => rm(path.join(d, 'instruction.md')), 'instruction.md: cannot read: ENOENT'],
    ['a memory size that is not one', (d) => writeFile(path.join(d, 'task.toml'), '[environment]\nmemory = "lots"\n'), 'task.toml: environment.memory: a size such as "2G"'],
  ];
  for (const [what, edit, expected] of cases) {
    it(what, async () => {
      const dir = await variant(what.replace(/\W+/g, '-'), 'hello-file', edit);
      const message = await problemsOf(dir);
      expect(message).toContain(expected);
      expect(message).toContain(dir);
      // Content never comes back: not of the linked file, not of a huge instruction.
      expect(message).not.toContain('root:');
      expect(message).not.toContain('xxxxxxxxxx');
    });
  }

  it('a batch with one broken Harbor task enqueues nothing and names that task', async () => {
    const dir = await variant('batch-broken', 'hello-file', (d) => writeFile(path.join(d, 'task.toml'), '[environment]\ngpus = 2\n'));
    const base = path.dirname(dir);
    await mkdir(path.join(base, 'good'), { recursive: true });
    await cp(path.join(FIXTURES, 'partial-credit'), path.join(base, 'good', 'partial-credit'), { recursive: true });
    await expect(loadBatchObject({ name: 'b', tasks: ['good', 'batch-broken'], agent: { kind: 'oracle' } }, { file: 'batch.yaml', base, hostEnv: {} }))
      .rejects.toThrow(/batch-broken: task\.toml: environment\.gpus/);
  });
});

describe('multi-step grading', () => {
  it('a gate is missed by a lower value or a missing key', () => {
    expect(missedGate(undefined, { reward: 0 })).toBeUndefined();
    expect(missedGate({ reward: 1 }, { reward: 1 })).toBeUndefined();
    expect(missedGate({ reward: 1 }, { reward: 0.5 })).toBe('reward=0.5 below min_reward 1');
    expect(missedGate({ correctness: 0.8 }, { reward: 1 })).toBe('correctness=missing below min_reward 0.8');
  });

  it('mean is per key over the graded steps, a key a step lacks counting 0; final is the last step', () => {
    const graded: { metrics: Record<string, number> }[] = [{ metrics: { reward: 1, style: 1 } }, { metrics: { reward: 0.5 } }];
    expect(aggregateSteps('mean', graded)).toEqual({ reward: 0.75, style: 0.5 });
    expect(aggregateSteps('final', graded)).toEqual({ reward: 0.5 });
  });
});
