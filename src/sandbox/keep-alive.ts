// The process that keeps a Harbor sandbox (and a services environment's namespace holder) running: a
// program of the runtime generation's read-only mount, so a root agent cannot put its own in its
// place for a restart (the image's `sleep` is the agent's to replace). It was the runtime's node
// idling on a timer: about 45 ms of host CPU to start in every sandbox and some 30 MB of the task's
// memory limit for the sandbox's whole life. It is now this: a static x86-64 Linux executable of 129
// bytes whose one instruction loop is pause(2), written here byte by byte (no compiler on the path to
// a runtime generation, and the same bytes on every host). A signal's default action ends it (SIGTERM
// from the engine's init at stop, SIGKILL); an ignored one (SIGCHLD) does not wake it.
//
// Layout: the ELF header (64 bytes), one PT_LOAD program header (56 bytes) mapping the whole file
// read and execute at 0x400000, then the code at offset 120:
//   b8 22 00 00 00   mov eax, 34        ; pause
//   0f 05            syscall
//   eb f7            jmp -9             ; back to mov
/** Where the keep-alive sits inside the runtime generation. */
export const KEEP_ALIVE_PATH = 'bin/keep-alive';

const BASE = 0x400000;
const HEADER = 64;
const PROGRAM_HEADER = 56;
const CODE = Buffer.from([0xb8, 0x22, 0x00, 0x00, 0x00, 0x0f, 0x05, 0xeb, 0xf7]);

/** The keep-alive's bytes. */
export function keepAliveProgram(): Buffer {
  const size = HEADER + PROGRAM_HEADER + CODE.length;
  const b = Buffer.alloc(size);
  // e_ident: magic, 64-bit, little-endian, version 1, System V ABI.
  Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0]).copy(b, 0);
  b.writeUInt16LE(2, 16); // e_type: ET_EXEC
  b.writeUInt16LE(0x3e, 18); // e_machine: x86-64
  b.writeUInt32LE(1, 20); // e_version
  b.writeBigUInt64LE(BigInt(BASE + HEADER + PROGRAM_HEADER), 24); // e_entry
  b.writeBigUInt64LE(BigInt(HEADER), 32); // e_phoff
  b.writeBigUInt64LE(0n, 40); // e_shoff: no sections
  b.writeUInt32LE(0, 48); // e_flags
  b.writeUInt16LE(HEADER, 52); // e_ehsize
  b.writeUInt16LE(PROGRAM_HEADER, 54); // e_phentsize
  b.writeUInt16LE(1, 56); // e_phnum
  b.writeUInt16LE(64, 58); // e_shentsize
  b.writeUInt16LE(0, 60); // e_shnum
  b.writeUInt16LE(0, 62); // e_shstrndx
  const ph = HEADER;
  b.writeUInt32LE(1, ph); // p_type: PT_LOAD
  b.writeUInt32LE(5, ph + 4); // p_flags: read, execute
  b.writeBigUInt64LE(0n, ph + 8); // p_offset
  b.writeBigUInt64LE(BigInt(BASE), ph + 16); // p_vaddr
  b.writeBigUInt64LE(BigInt(BASE), ph + 24); // p_paddr
  b.writeBigUInt64LE(BigInt(size), ph + 32); // p_filesz
  b.writeBigUInt64LE(BigInt(size), ph + 40); // p_memsz
  b.writeBigUInt64LE(0x1000n, ph + 48); // p_align
  CODE.copy(b, HEADER + PROGRAM_HEADER);
  return b;
}
