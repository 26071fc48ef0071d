// environment/docker-compose.yaml of a Harbor task, read at enqueue as Harbor merges it over the agent's
// service (`main`): sidecars from `image:` or `build:` (a context inside the task folder), depends_on,
// healthchecks, named volumes shared between services, command, entrypoint, environment, working_dir,
// expose, user; main's depends_on, volumes and environment apply to the agent's container.
// Everything else a compose file can ask for that would reach past the episode's own containers
// (privileges, host namespaces, host paths, the Docker socket, devices, capabilities beyond the main
// sandbox's, published ports, networks, other files) is refused here, naming the service and the key.
// `${VAR}` takes Harbor's own names (CONTEXT_DIR, MAIN_IMAGE_NAME, CPUS, MEMORY) and otherwise the
// enqueuing host's value, as task.toml's tables do, never a secret's or a fleet setting's.
import path from 'node:path';
import { parse as parseYaml } from 'yaml';
import { isSecretName } from '../config/secret-names.ts';
import { printable } from '../errors/printable.ts';
import { HARBOR_CAPABILITIES, type HarborServices, type HarborSidecar } from './task-spec.ts';

/** Where `${VAR}` values come from (the producer's environment, or none for a request to the API). */
type HostEnv = Readonly<Record<string, string | undefined>>;

/** Harbor's own variables for the task's compose file, as it exports them (H:environments/docker/docker.py). */
export interface ComposeContext {
  /** task.toml's cpus (Harbor: `CPUS`), and memory in MB (Harbor: `MEMORY` = "<n>M"). */
  cpus: number;
  memoryMb: number;
  /** [environment].build_timeout_sec: every sidecar build is bounded by it. */
  buildTimeoutSec: number;
  /** Whether a file or folder exists in the task folder (a path relative to it, "/"-separated). */
  exists(rel: string): boolean;
}

/** A sentinel standing for Harbor's CONTEXT_DIR (environment/, absolute in Harbor) while paths resolve. */
const CONTEXT_DIR = '/__harbor_context_dir__';
const MAIN_IMAGE = '__harbor_main_image__';

/** Settings of the fleet that a compose file must never read into a service (as harbor-task.ts). */
const FLEET_SETTING = /^(REDIS_|MODEL_|FLEET_|AWS_|S3_|DOCKER_|OPENAI_|ANTHROPIC_|API_)/;

/** Keys a service may have; anything else is refused, naming it. */
const SIDECAR_KEYS = new Set([
  'image', 'build', 'command', 'entrypoint', 'environment', 'working_dir', 'expose', 'depends_on', 'healthcheck', 'volumes', 'user',
  // Accepted without effect: every service gets the task's limits, and the fleet names its containers.
  'container_name', 'hostname', 'restart', 'labels', 'init', 'tty', 'stdin_open', 'pull_policy', 'platform', 'cpus', 'mem_limit', 'deploy', 'stop_grace_period', 'stop_signal',
]);
const MAIN_KEYS = new Set(['depends_on', 'volumes', 'environment', 'build', 'image', 'command', 'cpus', 'mem_limit', 'deploy', 'expose', 'container_name', 'hostname', 'restart', 'labels', 'init', 'tty', 'stdin_open', 'pull_policy', 'platform', 'healthcheck']);
const TOP_KEYS = new Set(['services', 'volumes', 'version', 'name']);

/** Why some keys are refused, in the message naming them. */
const REFUSED: Record<string, string> = {
  privileged: 'no service runs privileged',
  network_mode: 'every service of an episode shares its own network namespace (loopback only); a service cannot choose another',
  networks: 'services reach each other by name in the episode\'s one namespace; networks cannot be chosen',
  pid: 'no service shares a host or another container\'s namespace',
  ipc: 'no service shares a host or another container\'s namespace',
  uts: 'no service shares a host or another container\'s namespace',
  userns_mode: 'no service shares a host or another container\'s namespace',
  cgroup: 'no service shares a host or another container\'s namespace',
  cgroup_parent: 'services run in the engine\'s default cgroup with the task\'s limits',
  devices: 'no host device reaches a service',
  device_cgroup_rules: 'no host device reaches a service',
  gpus: 'this fleet\'s sandboxes have no GPUs',
  cap_add: `only capabilities the main sandbox already has (${HARBOR_CAPABILITIES.join(', ')})`,
  security_opt: 'every service runs with no-new-privileges and the engine\'s default profiles',
  sysctls: 'kernel settings are the engine\'s',
  ports: 'nothing is published on the host; services reach each other by name (use expose)',
  volumes_from: 'only named volumes of the compose file are shared',
  extends: 'one compose file: extends would read another',
  env_file: 'only environment written in the compose file (env_file reads another file)',
  secrets: 'no secret reaches a service',
  configs: 'no file outside the task folder reaches a service',
  links: 'services reach each other by name already',
  external_links: 'nothing outside the episode is reachable',
  extra_hosts: 'host names are the services\' own',
  dns: 'there is no DNS: host names are the services\' own',
  dns_search: 'there is no DNS: host names are the services\' own',
  dns_opt: 'there is no DNS: host names are the services\' own',
  mac_address: 'services share one namespace',
  ulimits: 'limits are the task\'s',
  oom_kill_disable: 'limits are the task\'s',
  oom_score_adj: 'limits are the task\'s',
  shm_size: 'limits are the task\'s',
  tmpfs: 'only named volumes are mounted',
  isolation: 'the engine\'s default isolation',
  runtime: 'the engine\'s default runtime',
  storage_opt: 'the disk limit is the task\'s',
  profiles: 'every service of the file runs',
};

export class ComposeProblem extends Error {}

function fail(message: string): never {
  throw new ComposeProblem(message);
}

/** Text of the file in a message: cut to its first 100 characters and its length past that. */
const cut = (t: string) => (t.length > 100 ? `${t.slice(0, 100)}...(${t.length} characters)` : t);

/** A value in a message: printable, cut, with Harbor's variables as the file wrote them. */
const show = (v: unknown) => JSON.stringify(printable(cut((typeof v === 'string' ? v : JSON.stringify(v) ?? String(v))
  .replaceAll(CONTEXT_DIR, '${CONTEXT_DIR}').replaceAll(MAIN_IMAGE, '${MAIN_IMAGE_NAME}'))));

/** Task services beside main at most (the TaskSpec's bound). */
export const MAX_SIDECARS = 16;

function isMap(v: unknown): v is Record<string, unknown> {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

/** Compose interpolation: `$$`, `$VAR`, `${VAR}`, `${VAR:-d}`, `${VAR-d}`, `${VAR:?e}`, `${VAR?e}`. */
function interpolate(text: string, field: string, vars: Record<string, string>, host: HostEnv): string {
  return text.replace(/\$(\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*)|\{[^}]*\}?)/g,
    (whole, _all, braced: string | undefined, op: string | undefined, arg: string | undefined, bare: string | undefined) => {
      if (whole === '$$') return '$';
      const name = braced ?? bare;
      if (name === undefined) fail(`${field}: ${show(whole)} is not a variable this file can use (write \${NAME} or \${NAME:-default})`);
      if (vars[name] !== undefined) return vars[name]!;
      if (isSecretName(name) || FLEET_SETTING.test(name)) fail(`${field}: \${${name}} would read a secret or a setting of the fleet into a service; write the value itself`);
      const found = host[name];
      const empty = found === undefined || (op?.startsWith(':') === true && found === '');
      if (!empty) return found;
      if (op === ':-' || op === '-') return arg ?? '';
      fail(`${field}: \${${name}} is not set where the batch was enqueued, and has no default (write \${${name}:-value})`);
    });
}

/** Every string of the parsed file interpolated (keys are not, as in compose). */
function interpolateAll(value: unknown, field: string, vars: Record<string, string>, host: HostEnv): unknown {
  if (typeof value === 'string') return interpolate(value, field, vars, host);
  if (Array.isArray(value)) return value.map((v, i) => interpolateAll(v, `${field}.${i}`, vars, host));
  if (isMap(value)) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, interpolateAll(v, field === '' ? k : `${field}.${k}`, vars, host)]));
  return value;
}

/** A compose duration ("30s", "1m30s", "500ms", "1h"), or a number of seconds, in seconds. */
export function composeDuration(value: unknown, field: string): number {
  if (typeof value === 'number' && Number.isFinite(value) && value >= 0) return value;
  if (typeof value !== 'string' || !/^(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+$/.test(value.trim())) fail(`${field}: a duration such as "30s" or "1m30s" (got ${show(value)})`);
  const unit: Record<string, number> = { ns: 1e-9, us: 1e-6, 'µs': 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600 };
  let total = 0;
  for (const m of value.trim().matchAll(/(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)/g)) total += Number(m[1]) * unit[m[2]!]!;
  return total;
}

/** A command string split as compose does (shell words, quotes, no expansion). */
export function shellWords(text: string, field: string): string[] {
  const words: string[] = [];
  let word = '';
  let inWord = false;
  let quote: '"' | "'" | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (quote === "'") {
      if (c === "'") quote = undefined; else word += c;
    } else if (quote === '"') {
      if (c === '"') quote = undefined;
      else if (c === '\\' && i + 1 < text.length && '"\\$`'.includes(text[i + 1]!)) word += text[++i];
      else word += c;
    } else if (c === "'" || c === '"') {
      quote = c; inWord = true;
    } else if (c === '\\' && i + 1 < text.length) {
      word += text[++i]; inWord = true;
    } else if (/\s/.test(c)) {
      if (inWord) words.push(word);
      word = ''; inWord = false;
    } else {
      word += c; inWord = true;
    }
  }
  if (quote !== undefined) fail(`${field}: an unclosed ${quote} quote`);
  if (inWord) words.push(word);
  return words;
}

function execForm(value: unknown, field: string): string[] {
  if (typeof value === 'string') return shellWords(value, field);
  if (Array.isArray(value) && value.every((v) => typeof v === 'string' || typeof v === 'number')) return value.map(String);
  fail(`${field}: a string or a list of strings (got ${show(value)})`);
}

function environment(value: unknown, field: string): Record<string, string> {
  const out: Record<string, string> = {};
  const put = (k: string, v: unknown) => {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k)) fail(`${field}: ${show(k)} is not an environment variable name`);
    // A bare "KEY" (or KEY: null) passes the host's value in compose: nothing of the host reaches a service here.
    if (v === null || v === undefined) fail(`${field}.${k}: no value; a service gets only values written in the file (write ${k}=value)`);
    if (typeof v !== 'string' && typeof v !== 'number' && typeof v !== 'boolean') fail(`${field}.${k}: a string, number or boolean (got ${show(v)})`);
    out[k] = String(v);
  };
  if (value === undefined || value === null) return out;
  if (Array.isArray(value)) {
    value.forEach((item, i) => {
      if (typeof item !== 'string') fail(`${field}.${i}: "KEY=value" (got ${show(item)})`);
      const eq = item.indexOf('=');
      if (eq < 0) put(item, undefined); else put(item.slice(0, eq), item.slice(eq + 1));
    });
  } else if (isMap(value)) {
    for (const [k, v] of Object.entries(value)) put(k, v);
  } else fail(`${field}: a list of "KEY=value" or a map (got ${show(value)})`);
  return out;
}

type Mount = HarborServices['main']['mounts'][number];
type Dep = HarborServices['main']['dependsOn'][number];

const DOCKER_SOCKET = /(^|\/)docker(\.sock)?$|\/run\/docker|containerd\.sock|podman\.sock/;

function mounts(value: unknown, field: string, declared: Set<string>): Mount[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) fail(`${field}: a list of "volume:/path[:ro]" (got ${show(value)})`);
  return value.map((item, i): Mount => {
    const where = `${field}.${i}`;
    let source: string | undefined;
    let target: string | undefined;
    let readOnly = false;
    if (typeof item === 'string') {
      const parts = item.split(':');
      if (parts.length === 1) fail(`${where}: ${show(item)} is an anonymous volume; only named volumes of the top-level volumes: are mounted (write name:${item})`);
      [source, target] = parts as [string, string];
      const mode = parts.slice(2).join(':');
      if (mode !== '' && !/^(ro|rw)(,(ro|rw|nocopy|z|Z))*$/.test(mode)) fail(`${where}: mode ${show(mode)} is not one of ro, rw`);
      readOnly = mode.split(',').includes('ro');
    } else if (isMap(item)) {
      for (const k of Object.keys(item)) if (!['type', 'source', 'target', 'read_only', 'volume'].includes(k)) fail(`${where}.${k}: not supported in a mount (only type volume, source, target, read_only)`);
      if (item.type !== 'volume') {
        const src = typeof item.source === 'string' ? item.source : '';
        if (DOCKER_SOCKET.test(src)) fail(`${where}: the Docker socket never reaches a service`);
        fail(`${where}.type: only named volumes are mounted (got ${show(item.type)}); host paths never reach a service`);
      }
      if (typeof item.source !== 'string' || typeof item.target !== 'string') fail(`${where}: a volume mount names its source and target`);
      source = item.source; target = item.target; readOnly = item.read_only === true;
    } else fail(`${where}: "volume:/path[:ro]" or a mount map (got ${show(item)})`);
    if (DOCKER_SOCKET.test(source!)) fail(`${where}: the Docker socket never reaches a service (got ${show(source)})`);
    if (/^[./~]/.test(source!) || source!.includes('/')) fail(`${where}: ${show(source)} is a host path; only named volumes of the top-level volumes: are mounted (host paths never reach a service)`);
    if (!declared.has(source!)) fail(`${where}: volume ${show(source)} is not declared in the top-level volumes:`);
    if (!target!.startsWith('/') || path.posix.normalize(target!) === '/') fail(`${where}: the target must be an absolute folder other than / (got ${show(target)})`);
    return { volume: source!, target: path.posix.normalize(target!), readOnly };
  });
}

function dependsOn(value: unknown, field: string): Dep[] {
  if (value === undefined || value === null) return [];
  if (Array.isArray(value)) {
    return value.map((s, i) => {
      if (typeof s !== 'string') fail(`${field}.${i}: a service name (got ${show(s)})`);
      return { service: s, condition: 'service_started' as const };
    });
  }
  if (!isMap(value)) fail(`${field}: a list of services or a map of service: {condition} (got ${show(value)})`);
  return Object.entries(value).map(([service, spec]) => {
    const cond = isMap(spec) ? spec.condition ?? 'service_started' : spec === null ? 'service_started' : undefined;
    if (isMap(spec)) for (const k of Object.keys(spec)) if (!['condition', 'restart', 'required'].includes(k)) fail(`${field}.${service}.${k}: not supported (only condition)`);
    if (cond !== 'service_started' && cond !== 'service_healthy') fail(`${field}.${service}.condition: service_started or service_healthy (got ${show(cond)})`);
    return { service, condition: cond };
  });
}

function healthcheck(value: unknown, field: string): HarborSidecar['healthcheck'] | 'disabled' | undefined {
  if (value === undefined || value === null) return undefined;
  if (!isMap(value)) fail(`${field}: a map with test (got ${show(value)})`);
  for (const k of Object.keys(value)) if (!['test', 'interval', 'timeout', 'retries', 'start_period', 'start_interval', 'disable'].includes(k)) fail(`${field}.${k}: not a healthcheck key`);
  if (value.disable === true) return 'disabled';
  const t = value.test;
  let test: string[];
  if (typeof t === 'string') test = ['/bin/sh', '-c', t];
  else if (Array.isArray(t) && t.length > 0 && t.every((x) => typeof x === 'string')) {
    const [kind, ...rest] = t as string[];
    if (kind === 'NONE') return 'disabled';
    if (kind === 'CMD' && rest.length > 0) test = rest;
    else if (kind === 'CMD-SHELL' && rest.length === 1) test = ['/bin/sh', '-c', rest[0]!];
    else fail(`${field}.test: ["CMD", ...], ["CMD-SHELL", "command"] or a string (got ${show(t)})`);
  } else fail(`${field}.test: ["CMD", ...], ["CMD-SHELL", "command"] or a string (got ${show(t)})`);
  const retries = value.retries ?? 3;
  if (typeof retries !== 'number' || !Number.isInteger(retries) || retries < 1 || retries > 1000) fail(`${field}.retries: a whole number from 1 to 1000 (got ${show(retries)})`);
  const positive = (v: unknown, def: number, key: string) => {
    const s = v === undefined ? def : composeDuration(v, `${field}.${key}`);
    if (s <= 0 || s > 3600) fail(`${field}.${key}: more than 0 and at most 1h (got ${show(v)})`);
    return s;
  };
  const startPeriodSec = value.start_period === undefined ? 0 : composeDuration(value.start_period, `${field}.start_period`);
  if (startPeriodSec > 3600) fail(`${field}.start_period: at most 1h (got ${show(value.start_period)})`);
  return { test, intervalSec: positive(value.interval, 30, 'interval'), timeoutSec: positive(value.timeout, 30, 'timeout'), retries, startPeriodSec };
}

function refuseKeys(svc: Record<string, unknown>, name: string, allowed: Set<string>): void {
  for (const key of Object.keys(svc)) {
    if (key.startsWith('x-')) continue;
    const field = `services.${name}.${key}`;
    if (key === 'cap_add') {
      const caps = svc[key];
      if (!Array.isArray(caps)) fail(`${field}: a list of capabilities (got ${show(caps)})`);
      const beyond = caps.map((c) => String(c).toUpperCase().replace(/^CAP_/, '')).filter((c) => !(HARBOR_CAPABILITIES as readonly string[]).includes(c));
      if (beyond.length > 0) fail(`${field}: ${beyond.map((c) => show(c)).join(', ')} refused: ${REFUSED.cap_add}`);
      continue;
    }
    if (key === 'working_dir' && allowed === MAIN_KEYS) fail(`${field}: main's working folder is task.toml's [environment].workdir`);
    if (key === 'cap_drop' || key === 'read_only') continue; // accepted without effect: they would only take away
    if (REFUSED[key] !== undefined) fail(`${field}: refused: ${REFUSED[key]} (got ${show(svc[key])})`);
    if (!allowed.has(key)) fail(`${field}: not supported for a task service (got ${show(svc[key])})`);
  }
}

/** A build context of a sidecar: a folder inside the task folder, with its Dockerfile. */
function buildContext(value: unknown, field: string, ctx: ComposeContext): { context: string; dockerfile: string } {
  const spec = typeof value === 'string' ? { context: value } : value;
  if (!isMap(spec)) fail(`${field}: a context folder or a map with context (got ${show(value)})`);
  for (const k of Object.keys(spec)) {
    if (k === 'args' || k === 'secrets' || k === 'ssh' || k === 'network' || k === 'additional_contexts' || k === 'extra_hosts' || k === 'privileged' || k === 'entitlements' || k === 'cache_from' || k === 'cache_to') {
      fail(`${field}.${k}: refused: a sidecar is built like the main environment, from its folder alone (no network, no host files)`);
    }
    if (!['context', 'dockerfile', 'target', 'labels'].includes(k)) fail(`${field}.${k}: not supported in build`);
  }
  if (spec.target !== undefined) fail(`${field}.target: build stages are not supported (the last stage is built)`);
  const raw = typeof spec.context === 'string' ? spec.context : '.';
  // Relative to the compose file's folder (environment/), as compose resolves it; CONTEXT_DIR is environment/.
  const abs = raw.startsWith(CONTEXT_DIR) ? `/environment${raw.slice(CONTEXT_DIR.length)}` : path.posix.resolve('/environment', raw);
  const rel = path.posix.normalize(abs).replace(/^\/+/, '').replace(/\/+$/, '');
  if (!(rel === 'environment' || rel.startsWith('environment/')) || raw.startsWith('/') && !raw.startsWith(CONTEXT_DIR)) {
    fail(`${field}.context: ${show(raw)} is outside the task's environment/ folder (a sidecar is built from a folder of the task)`);
  }
  const dockerfile = typeof spec.dockerfile === 'string' ? spec.dockerfile : 'Dockerfile';
  const dfRel = path.posix.normalize(path.posix.join(rel, dockerfile));
  if (dockerfile.startsWith('/') || !(dfRel === rel || dfRel.startsWith(`${rel}/`))) fail(`${field}.dockerfile: ${show(dockerfile)} is outside the build context`);
  if (!ctx.exists(dfRel)) fail(`${field}: ${show(dfRel)} is not in the task folder`);
  return { context: rel, dockerfile: path.posix.relative(rel, dfRel) };
}

/**
 * The services of a compose file, or a ComposeProblem naming the service and the key. `text` is the
 * file's content; `host` the enqueuing host's environment (empty on the API's behalf).
 */
export function readHarborCompose(text: string, ctx: ComposeContext, host: HostEnv): HarborServices {
  let raw: unknown;
  try {
    raw = parseYaml(text, { maxAliasCount: 100 });
  } catch (err) {
    fail(`not valid YAML: ${printable(String((err as Error).message).split('\n')[0] ?? '')}`);
  }
  if (!isMap(raw)) fail('not a mapping of compose keys');
  for (const key of Object.keys(raw)) {
    if (key.startsWith('x-')) continue;
    if (key === 'networks') fail('networks: refused: every service of an episode shares its own namespace; networks cannot be declared');
    if (key === 'secrets' || key === 'configs') fail(`${key}: refused: no file or secret outside the compose file reaches a service`);
    if (key === 'include') fail('include: refused: one compose file, nothing read beside it');
    if (!TOP_KEYS.has(key)) fail(`${key}: not a supported top-level key (services, volumes)`);
  }
  const vars = { CONTEXT_DIR, MAIN_IMAGE_NAME: MAIN_IMAGE, CPUS: String(ctx.cpus), MEMORY: `${ctx.memoryMb}M` };
  const doc = interpolateAll(raw, '', vars, host) as Record<string, unknown>;
  const volumesRaw = doc.volumes ?? {};
  if (!isMap(volumesRaw)) fail(`volumes: a map of volume names (got ${show(volumesRaw)})`);
  for (const [name, spec] of Object.entries(volumesRaw)) {
    if (!/^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/.test(name)) fail(`volumes.${show(name)}: not a volume name`);
    if (spec !== null && !(isMap(spec) && Object.keys(spec).length === 0)) fail(`volumes.${name}: refused: a volume is the episode's own, empty at start (no driver, driver_opts, external or name)`);
  }
  const declared = new Set(Object.keys(volumesRaw));
  const servicesRaw = doc.services;
  if (!isMap(servicesRaw) || Object.keys(servicesRaw).length === 0) fail('services: a map of services (main and its sidecars)');
  const names = Object.keys(servicesRaw);
  for (const name of names) if (!/^[a-z0-9][a-z0-9_.-]{0,62}$/.test(name)) fail(`services.${show(name)}: a service name is lower-case letters, digits, "_", "." and "-"`);
  const beside = names.filter((n) => n !== 'main').length;
  if (beside > MAX_SIDECARS) fail(`services: at most ${MAX_SIDECARS} task services beside main (got ${beside})`);
  let main: HarborServices['main'] = { dependsOn: [], mounts: [], env: {} };
  const sidecars: HarborSidecar[] = [];
  for (const [name, svcRaw] of Object.entries(servicesRaw)) {
    const field = `services.${name}`;
    const svc = svcRaw ?? {};
    if (!isMap(svc)) fail(`${field}: a map of service keys`);
    if (name === 'main') {
      refuseKeys(svc, name, MAIN_KEYS);
      if (svc.image !== undefined && svc.image !== MAIN_IMAGE) fail(`${field}.image: main's image is the task's (task.toml's docker_image or environment/Dockerfile), so only \${MAIN_IMAGE_NAME} (got ${show(svc.image)})`);
      if (svc.build !== undefined) {
        const b = buildContext(svc.build, `${field}.build`, { ...ctx, exists: () => true });
        if (b.context !== 'environment' || b.dockerfile !== 'Dockerfile') fail(`${field}.build: main is built from environment/Dockerfile (got ${show(`${b.context}/${b.dockerfile}`)})`);
      }
      main = { dependsOn: dependsOn(svc.depends_on, `${field}.depends_on`), mounts: mounts(svc.volumes, `${field}.volumes`, declared), env: environment(svc.environment, `${field}.environment`) };
      continue;
    }
    refuseKeys(svc, name, SIDECAR_KEYS);
    let image: HarborSidecar['image'];
    if (svc.build !== undefined) {
      image = { from: 'build', ...buildContext(svc.build, `${field}.build`, ctx), timeoutSec: ctx.buildTimeoutSec };
    } else if (svc.image === MAIN_IMAGE) image = { from: 'main' };
    else if (typeof svc.image === 'string' && svc.image !== '') image = { from: 'image', reference: svc.image };
    else fail(`${field}: needs image: or build:`);
    const hc = healthcheck(svc.healthcheck, `${field}.healthcheck`);
    const expose = svc.expose === undefined ? [] : Array.isArray(svc.expose) ? svc.expose.map((p, i) => {
      const m = /^(\d+)(\/(tcp|udp))?$/.exec(String(p));
      const n = m ? Number(m[1]) : NaN;
      if (!(n >= 1 && n <= 65535)) fail(`${field}.expose.${i}: a port such as 8000 (got ${show(p)})`);
      return n;
    }) : fail(`${field}.expose: a list of ports (got ${show(svc.expose)})`);
    const workdir = svc.working_dir;
    if (workdir !== undefined && (typeof workdir !== 'string' || !workdir.startsWith('/'))) fail(`${field}.working_dir: an absolute path (got ${show(workdir)})`);
    const user = svc.user;
    if (user !== undefined && (typeof user !== 'string' && typeof user !== 'number' || String(user).length > 65)) fail(`${field}.user: a user name or uid[:gid] (got ${show(user)})`);
    sidecars.push({
      name,
      image,
      ...(svc.entrypoint !== undefined && svc.entrypoint !== null && { entrypoint: execForm(svc.entrypoint, `${field}.entrypoint`) }),
      ...(svc.command !== undefined && svc.command !== null && { command: execForm(svc.command, `${field}.command`) }),
      env: environment(svc.environment, `${field}.environment`),
      ...(typeof workdir === 'string' && { workdir }),
      ...(user !== undefined && { user: String(user) }),
      expose,
      ...(hc !== undefined && hc !== 'disabled' && { healthcheck: hc }),
      dependsOn: dependsOn(svc.depends_on, `${field}.depends_on`),
      mounts: mounts(svc.volumes, `${field}.volumes`, declared),
    });
  }
  if (sidecars.length === 0) fail('services: no service beside main (a task with one container needs no docker-compose.yaml)');
  // Every dependency names a service of the file, and is not main: main starts last.
  const all = new Set(names);
  const check = (deps: Dep[], who: string) => {
    for (const d of deps) {
      if (!all.has(d.service)) fail(`services.${who}.depends_on: ${show(d.service)} is not a service of the file`);
      if (d.service === 'main') fail(`services.${who}.depends_on: main starts after every sidecar; no service can wait for it`);
      if (d.service === who) fail(`services.${who}.depends_on: a service cannot wait for itself`);
      if (d.condition === 'service_healthy' && !sidecars.find((s) => s.name === d.service)?.healthcheck) {
        fail(`services.${who}.depends_on.${d.service}: condition service_healthy, and ${d.service} has no healthcheck in the file`);
      }
    }
  };
  check(main.dependsOn, 'main');
  for (const s of sidecars) check(s.dependsOn, s.name);
  startOrder(sidecars);
  return { volumes: [...declared], sidecars, main };
}

/** The sidecars in an order where each starts after what it depends on; a cycle is refused. */
export function startOrder<T extends { name: string; dependsOn: { service: string }[] }>(sidecars: T[]): T[] {
  const byName = new Map(sidecars.map((s) => [s.name, s]));
  const order: T[] = [];
  const state = new Map<string, 'visiting' | 'done'>();
  const visit = (s: T, chain: string[]) => {
    if (state.get(s.name) === 'done') return;
    if (state.get(s.name) === 'visiting') fail(`services.${s.name}.depends_on: a cycle (${[...chain, s.name].join(' -> ')})`);
    state.set(s.name, 'visiting');
    for (const d of s.dependsOn) visit(byName.get(d.service)!, [...chain, s.name]);
    state.set(s.name, 'done');
    order.push(s);
  };
  for (const s of sidecars) visit(s, []);
  return order;
}

/** The longest a service's healthcheck is waited for: its start period, then every retry timing out. */
export function healthcheckBoundSec(h: NonNullable<HarborSidecar['healthcheck']>): number {
  return h.startPeriodSec + h.retries * (h.intervalSec + h.timeoutSec);
}
