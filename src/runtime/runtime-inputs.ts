// What goes into a runtime generation: the portable Node.js (the node binary, its loader and the
// libraries `ldd` lists, plus a bin/node launcher) and any extra files, each at a path of the runtime
// with a fixed mode. Inputs are plain data so they can cross into the builder's worker thread.
import { execFile } from 'node:child_process';
import { stat } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { portableNodeBinary } from './portable-node.ts';
import { promisify } from 'node:util';
import { FleetError } from '../errors/fleet-error.ts';

/** Where sandboxes see the runtime (read-only). */
export { RUNTIME_MOUNT_PATH } from './portable-node.ts';

/** File modes a runtime may hold: files are root's and readable by all; executables also run for all. */
export type RuntimeMode = 0o644 | 0o755;

interface InputBase {
  /** Path inside the runtime, relative, `/`-separated (e.g. `lib/libc.so.6`). */
  path: string;
  mode: RuntimeMode;
}

/** A file of the runtime copied from the host (symlinks are followed). */
export interface FileInput extends InputBase {
  /** Absolute path on the host. */
  source: string;
}

/** A small file of the runtime given inline (e.g. the launcher script). */
export interface ContentInput extends InputBase {
  /** UTF-8 text. */
  content: string;
}

export type RuntimeInput = FileInput | ContentInput;

/** The inputs of one generation; their order does not matter (the manifest sorts them). */
export type RuntimeInputs = readonly RuntimeInput[];

/** An extra host file to ship in the runtime, e.g. the bundled reference agent. */
export interface ExtraFile {
  /** Absolute path on the host. */
  source: string;
  /** Path inside the runtime, e.g. `agent/agent.mjs`. */
  path: string;
  /** @default 0o755 when the host file is executable by its owner, else 0o644 */
  mode?: RuntimeMode;
}

/** Name of the ready marker at the root of an installed volume; no input may use it. */
export const READY_MARKER = '.rollout-fleet-ready';

const SAFE_PATH = /^[A-Za-z0-9_+][A-Za-z0-9._+-]*(\/[A-Za-z0-9_+][A-Za-z0-9._+-]*)*$/;

/**
 * Check inputs before anything reads them: relative, normalised, unique paths of safe characters,
 * a file never where another input needs a folder, modes 0o644 or 0o755, absolute sources.
 * Throws a TypeError naming the input.
 */
export function checkRuntimeInputs(inputs: RuntimeInputs): void {
  if (!Array.isArray(inputs) || inputs.length === 0) {
    throw new TypeError(`Expected \`inputs\` to be a non-empty array, got ${JSON.stringify(inputs)}`);
  }
  const files = new Set<string>();
  const dirs = new Set<string>();
  for (const [i, input] of inputs.entries()) {
    const where = `inputs[${i}]`;
    if (input.path === READY_MARKER) throw new TypeError(`\`${where}.path\` ${READY_MARKER} is reserved for the ready marker`);
    if (typeof input.path !== 'string' || !SAFE_PATH.test(input.path) || input.path.split('/').includes('..')) {
      throw new TypeError(`Expected \`${where}.path\` to be a relative path of letters, digits, ., _, + and -, got ${JSON.stringify(input.path)}`);
    }
    if (input.mode !== 0o644 && input.mode !== 0o755) {
      throw new TypeError(`Expected \`${where}.mode\` to be 0o644 or 0o755, got ${String(input.mode)}`);
    }
    if ('source' in input) {
      if (typeof input.source !== 'string' || !path.isAbsolute(input.source)) {
        throw new TypeError(`Expected \`${where}.source\` to be an absolute path, got ${JSON.stringify(input.source)}`);
      }
    } else if (typeof (input as ContentInput).content !== 'string') {
      throw new TypeError(`Expected \`${where}\` to have a \`source\` path or a string \`content\``);
    }
    if (files.has(input.path) || dirs.has(input.path)) throw new TypeError(`\`${where}.path\` ${input.path} is used twice`);
    files.add(input.path);
    const parts = input.path.split('/');
    for (let n = 1; n < parts.length; n++) dirs.add(parts.slice(0, n).join('/'));
  }
  for (const dir of dirs) {
    if (files.has(dir)) throw new TypeError(`input path ${dir} is a file and also a folder of another input`);
  }
}

/**
 * The launcher at bin/node: runs the runtime's own node with its own loader and libraries, so it works
 * in any x86_64 image, with or without a libc. It finds the runtime from its own path, so the volume
 * may be mounted anywhere (default /opt/rollout-fleet). Task verifiers may call it too.
 */
export const NODE_LAUNCHER = `#!/bin/sh
# rollout-fleet portable Node.js: node.real's interpreter and rpath are the runtime's own loader and
# libraries (see portable-node.ts), whatever the image holds.
exec "\${0%/*}/node.real" "$@"
`;

const LOADER = 'ld-linux-x86-64.so.2';

/** The libraries and loader `ldd` lists for a binary: absolute host paths (the vDSO excluded). */
export async function sharedLibrariesOf(binary: string): Promise<string[]> {
  let stdout: string;
  try {
    ({ stdout } = await promisify(execFile)('ldd', [binary], { timeout: 10_000 }));
  } catch (err) {
    throw new FleetError('runtime_unavailable', `ldd ${binary} failed: ${(err as Error).message}`, { cause: err });
  }
  const libs: string[] = [];
  for (const line of stdout.split('\n')) {
    // "libm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
    const match = /(?:=>\s*)?(\/\S+)\s+\(0x[0-9a-f]+\)/.exec(line);
    if (match?.[1]) libs.push(match[1]);
    else if (/not found/.test(line)) throw new FleetError('runtime_unavailable', `ldd ${binary}: ${line.trim()}`);
  }
  if (!libs.some((lib) => path.basename(lib) === LOADER)) {
    throw new FleetError('runtime_unavailable', `ldd ${binary} lists no ${LOADER}: only x86_64 glibc builds of node are supported`);
  }
  return libs;
}

/**
 * The inputs of the default runtime: this process's node binary as bin/node.real, the loader and
 * libraries `ldd` lists in lib/, the bin/node launcher, and `extraFiles`.
 */
export async function defaultRuntimeInputs(
  extraFiles: readonly ExtraFile[] = [],
  opts: {
    /** Where the patched copy of the node binary is cached. @default <tmpdir>/rollout-fleet-runtime */
    cacheDir?: string;
    /** @default process.execPath */
    nodeBinary?: string;
  } = {},
): Promise<RuntimeInput[]> {
  const nodeBinary = opts.nodeBinary ?? process.execPath;
  // bin/node.real is a copy whose interpreter and rpath are the runtime's own (portable-node.ts).
  const runtimeNodeBinary = await portableNodeBinary(opts.cacheDir ?? path.join(os.tmpdir(), 'rollout-fleet-runtime'), nodeBinary);
  const inputs: RuntimeInput[] = [
    { path: 'bin/node', mode: 0o755, content: NODE_LAUNCHER },
    { path: 'bin/node.real', mode: 0o755, source: runtimeNodeBinary },
  ];
  for (const lib of await sharedLibrariesOf(nodeBinary)) {
    const name = path.basename(lib);
    inputs.push({ path: `lib/${name}`, mode: name === LOADER ? 0o755 : 0o644, source: lib });
  }
  for (const extra of extraFiles) {
    let mode = extra.mode;
    if (mode === undefined) {
      const st = await stat(extra.source).catch((err: unknown) => {
        throw new FleetError('runtime_unavailable', `extra runtime file ${extra.source}: ${(err as Error).message}`, { cause: err });
      });
      mode = st.mode & 0o100 ? 0o755 : 0o644;
    }
    inputs.push({ path: extra.path, mode, source: extra.source });
  }
  checkRuntimeInputs(inputs);
  return inputs;
}
