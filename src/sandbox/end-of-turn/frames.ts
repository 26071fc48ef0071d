// The framed stream of the end-of-turn exec (end-of-turn-main.ts writes it on stdout, the worker reads
// it in end-of-turn.ts): each frame is one type byte, a 4-byte big-endian length and that many bytes.
// Framing is what keeps bytes apart: whatever the verifier prints (frame markers, a tar header, JSON
// that looks like a reward) arrives inside an output frame as data, never as a frame of its own.
// Shared by both sides: the program bundles it, so a change here is a new runtime generation.

/** The frame types, in the order they come. */
export const FRAME = {
  /** A chunk of the workspace's tar (entries named as the engine's getArchive names them). */
  workspace: 0x57, // 'W'
  /** JSON: the copy's end, `{ whole, bytes, why? }`: `whole` false means the worker asks the engine at close. */
  workspaceEnd: 0x77, // 'w'
  /** JSON: `{ ok, why?, code? }`: the tests are in /tests (or why not, with the errno code). */
  testsIn: 0x54, // 'T'
  /** JSON: `{ processes: [{ pid, uid, cmd }], more }`: what runs beside the grader (the agent's processes kept). */
  beside: 0x42, // 'B'
  /** JSON: `{ ok, why? }`: /logs/verifier is an empty real folder (a reward-file task), or it needs root. */
  logsReset: 0x4c, // 'L'
  /** Empty: the verifier starts now. From here the exec's exit code is the verifier's. */
  verifierStart: 0x53, // 'S'
  /** A chunk of the verifier's stdout. */
  stdout: 0x4f, // 'O'
  /** A chunk of the verifier's stderr. */
  stderr: 0x45, // 'E'
  /** JSON: the reward files the verifier left, `{ json?, txt? }` (base64; `notRegular` names one that is not a regular file). */
  reward: 0x52, // 'R'
  /** A chunk of /logs's tar, as the verifier left it (a reward-file task's). */
  logs: 0x47, // 'G'
  /** JSON: the /logs copy's end, `{ whole, bytes, why? }`: `whole` false means the worker asks the engine at close. */
  logsEnd: 0x67, // 'g'
  /** JSON: `{ why }`: the program failed before the verifier started. */
  failed: 0x46, // 'F'
} as const;

export type FrameType = (typeof FRAME)[keyof typeof FRAME];

/** A frame longer than this is never written, and read as a broken stream. */
export const MAX_FRAME_BYTES = 1024 * 1024;

export function encodeFrame(type: FrameType, payload: Uint8Array = new Uint8Array(0)): Buffer {
  if (payload.length > MAX_FRAME_BYTES) throw new RangeError(`frame of ${payload.length} bytes is over ${MAX_FRAME_BYTES}`);
  const header = Buffer.alloc(5);
  header[0] = type;
  header.writeUInt32BE(payload.length, 1);
  return Buffer.concat([header, payload]);
}

export const jsonFrame = (type: FrameType, value: unknown): Buffer => encodeFrame(type, Buffer.from(JSON.stringify(value)));

/** Reads frames from the chunks of a byte stream; `push` calls `onFrame` for every whole frame in order. */
export class FrameReader {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  /** Set once the stream broke the format (an unknown type, a frame over the cap): nothing more is read. */
  broken: string | undefined;

  constructor(private readonly onFrame: (type: FrameType, payload: Buffer) => void) {}

  push(chunk: Buffer): void {
    if (this.broken !== undefined) return;
    this.pending.push(chunk);
    this.pendingBytes += chunk.length;
    while (this.pendingBytes >= 5) {
      const head = this.pending.length === 1 ? this.pending[0]! : Buffer.concat(this.pending);
      this.pending = [head];
      const type = head[0]!;
      const length = head.readUInt32BE(1);
      if (!KNOWN.has(type) || length > MAX_FRAME_BYTES) {
        // Often not a frame at all but the engine's own words ("OCI runtime exec failed: ..."): shown, as text.
        this.broken = `a frame of type 0x${type.toString(16)} and ${length} bytes (the stream began ${JSON.stringify(head.subarray(0, 80).toString('latin1').replace(/[^\x20-\x7e]/g, '?'))})`;
        this.pending = [];
        this.pendingBytes = 0;
        return;
      }
      if (head.length < 5 + length) return;
      const payload = head.subarray(5, 5 + length);
      const rest = head.subarray(5 + length);
      this.pending = rest.length > 0 ? [rest] : [];
      this.pendingBytes = rest.length;
      this.onFrame(type as FrameType, payload);
    }
  }

  /** Bytes of a frame that never came whole. */
  get leftover(): number {
    return this.pendingBytes;
  }
}

const KNOWN = new Set<number>(Object.values(FRAME));
