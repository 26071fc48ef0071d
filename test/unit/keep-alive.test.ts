// The keep-alive's bytes: a static x86-64 executable whose only code is pause(2) in a loop. Run for
// real, as the sandboxes run it: it stays asleep with next to no memory, and a signal's default action
// ends it.
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmod, mkdtemp, readFile, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { keepAliveProgram } from '../../src/sandbox/keep-alive.ts';

describe('the keep-alive program', () => {
  it('is a 64-bit little-endian x86-64 executable loading itself at 0x400000 and entering at its code', () => {
    const b = keepAliveProgram();
    expect(b.length).toBe(129);
    expect([...b.subarray(0, 4)]).toEqual([0x7f, 0x45, 0x4c, 0x46]);
    expect(b[4]).toBe(2); // ELFCLASS64
    expect(b[5]).toBe(1); // little-endian
    expect(b.readUInt16LE(16)).toBe(2); // ET_EXEC
    expect(b.readUInt16LE(18)).toBe(0x3e); // x86-64
    expect(b.readBigUInt64LE(24)).toBe(0x400000n + 120n);
    expect(b.readUInt32LE(64)).toBe(1); // PT_LOAD
    expect(b.readBigUInt64LE(64 + 32)).toBe(129n); // the whole file mapped
    // mov eax, 34 (pause); syscall; jmp back to the mov.
    expect([...b.subarray(120)]).toEqual([0xb8, 34, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7]);
    expect(keepAliveProgram().equals(b)).toBe(true);
  });

  it('sleeps with next to no memory until a signal ends it', async () => {
    const file = path.join(await mkdtemp(path.join(os.tmpdir(), 'rf-keep-alive-')), 'keep-alive');
    await writeFile(file, keepAliveProgram());
    await chmod(file, 0o755);
    const child = spawn(file, [], { stdio: 'ignore' });
    const exited = once(child, 'exit');
    let status = '';
    // Poll until the kernel shows it asleep in pause (state S), not spinning (R) or gone.
    for (let i = 0; i < 200 && !/^State:\s+S/m.test(status); i++) {
      status = await readFile(`/proc/${child.pid}/status`, 'utf8').catch(() => '');
      if (!/^State:\s+S/m.test(status)) await new Promise((r) => setImmediate(r));
    }
    expect(status).toMatch(/^State:\s+S/m);
    expect(Number(/^VmRSS:\s+(\d+) kB/m.exec(status)?.[1] ?? Infinity)).toBeLessThan(256);
    child.kill('SIGTERM');
    const [code, signal] = await exited;
    expect({ code, signal }).toEqual({ code: null, signal: 'SIGTERM' });
  });
});
