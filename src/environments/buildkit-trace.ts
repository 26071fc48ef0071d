// BuildKit's progress, as the engine streams it from `POST /build?version=2`: JSON lines whose
// `moby.buildkit.trace` entries carry a base64 protobuf StatusResponse (moby/buildkit's
// api/services/control: vertexes = 1, statuses = 2, logs = 3, warnings = 4). Only what a readable log
// needs is decoded: each step's name when it starts, whether it was cached, its error, and what its
// commands printed. A hand-written reader of the protobuf wire format (varints and length-delimited
// fields) is enough for that and needs no schema compiler.

/** One build step (a Dockerfile instruction, or an internal step such as loading the context). */
export interface TraceVertex {
  digest: string;
  name: string;
  cached: boolean;
  started: boolean;
  completed: boolean;
  error: string;
}

/** Output of a step's command. */
export interface TraceLog {
  vertex: string;
  msg: Buffer;
}

export interface TraceStatus {
  vertexes: TraceVertex[];
  logs: TraceLog[];
  /** Warnings' short texts. */
  warnings: string[];
}

interface Field {
  no: number;
  /** Varint value (wire type 0), or undefined. */
  varint?: bigint;
  /** Bytes of a length-delimited field (wire type 2), or undefined. */
  bytes?: Buffer;
}

function readVarint(buf: Buffer, at: { pos: number }): bigint {
  let result = 0n;
  let shift = 0n;
  for (;;) {
    if (at.pos >= buf.length) throw new RangeError('truncated varint');
    const byte = buf[at.pos++]!;
    result |= BigInt(byte & 0x7f) << shift;
    if ((byte & 0x80) === 0) return result;
    shift += 7n;
    if (shift > 70n) throw new RangeError('varint too long');
  }
}

function* fields(buf: Buffer): Generator<Field> {
  const at = { pos: 0 };
  while (at.pos < buf.length) {
    const key = Number(readVarint(buf, at));
    const no = key >>> 3;
    const wire = key & 7;
    if (wire === 0) yield { no, varint: readVarint(buf, at) };
    else if (wire === 2) {
      const len = Number(readVarint(buf, at));
      if (at.pos + len > buf.length) throw new RangeError('truncated field');
      yield { no, bytes: buf.subarray(at.pos, at.pos + len) };
      at.pos += len;
    } else if (wire === 1) at.pos += 8;
    else if (wire === 5) at.pos += 4;
    else throw new RangeError(`unsupported protobuf wire type ${wire}`);
  }
}

function vertexOf(buf: Buffer): TraceVertex {
  const v: TraceVertex = { digest: '', name: '', cached: false, started: false, completed: false, error: '' };
  for (const f of fields(buf)) {
    if (f.no === 1 && f.bytes) v.digest = f.bytes.toString('utf8');
    else if (f.no === 3 && f.bytes) v.name = f.bytes.toString('utf8');
    else if (f.no === 4) v.cached = f.varint === 1n;
    else if (f.no === 5) v.started = true;
    else if (f.no === 6) v.completed = true;
    else if (f.no === 7 && f.bytes) v.error = f.bytes.toString('utf8');
  }
  return v;
}

/** Decode one `moby.buildkit.trace` entry's `aux` (base64). Throws RangeError on bytes that are not a StatusResponse. */
export function decodeTrace(base64: string): TraceStatus {
  const status: TraceStatus = { vertexes: [], logs: [], warnings: [] };
  for (const f of fields(Buffer.from(base64, 'base64'))) {
    if (!f.bytes) continue;
    if (f.no === 1) status.vertexes.push(vertexOf(f.bytes));
    else if (f.no === 3) {
      const log: TraceLog = { vertex: '', msg: Buffer.alloc(0) };
      for (const g of fields(f.bytes)) {
        if (g.no === 1 && g.bytes) log.vertex = g.bytes.toString('utf8');
        else if (g.no === 4 && g.bytes) log.msg = g.bytes;
      }
      status.logs.push(log);
    } else if (f.no === 4) {
      for (const g of fields(f.bytes)) if (g.no === 3 && g.bytes) status.warnings.push(g.bytes.toString('utf8'));
    }
  }
  return status;
}

/**
 * Keeps a build's log as text, like `docker build --progress=plain` would show it: `#N <step>` when a
 * step starts, its output prefixed by its number, `#N CACHED`, `#N ERROR: ...`. Capped at `capBytes`:
 * past it the oldest text goes (the end of a failed build says why it failed), with a marker.
 */
export class BuildLog {
  private readonly numbers = new Map<string, number>();
  private readonly announced = new Set<string>();
  private readonly finished = new Set<string>();
  private chunks: string[] = [];
  private bytes = 0;
  private dropped = 0;

  constructor(private readonly capBytes: number) {}

  /** Add one parsed JSON line of the build answer. */
  addLine(entry: unknown): void {
    if (entry === null || typeof entry !== 'object') return;
    const e = entry as { id?: unknown; aux?: unknown; stream?: unknown; error?: unknown; errorDetail?: { message?: unknown } };
    if (e.id === 'moby.buildkit.trace' && typeof e.aux === 'string') {
      let status: TraceStatus;
      try {
        status = decodeTrace(e.aux);
      } catch {
        return; // a newer engine's format: its plain lines (stream, error) still reach the log
      }
      this.addStatus(status);
    } else if (typeof e.stream === 'string') {
      this.append(e.stream);
    } else if (typeof e.error === 'string' || typeof e.errorDetail?.message === 'string') {
      const message = typeof e.errorDetail?.message === 'string' ? e.errorDetail.message : String(e.error);
      this.append(`ERROR: ${message}\n`);
    }
  }

  private number(digest: string): number {
    let n = this.numbers.get(digest);
    if (n === undefined) this.numbers.set(digest, (n = this.numbers.size + 1));
    return n;
  }

  private addStatus(status: TraceStatus): void {
    for (const v of status.vertexes) {
      const n = this.number(v.digest);
      if (!this.announced.has(v.digest) && v.name && (v.started || v.cached || v.completed)) {
        this.announced.add(v.digest);
        this.append(`#${n} ${v.name}\n`);
      }
      if (v.completed && !this.finished.has(v.digest)) {
        this.finished.add(v.digest);
        if (v.error) this.append(`#${n} ERROR: ${v.error}\n`);
        else if (v.cached) this.append(`#${n} CACHED\n`);
      }
    }
    for (const log of status.logs) {
      const n = this.number(log.vertex);
      const text = log.msg.toString('utf8');
      for (const line of text.split('\n')) if (line !== '') this.append(`#${n} ${line.replace(/\r$/, '')}\n`);
    }
    for (const warning of status.warnings) this.append(`WARNING: ${warning}\n`);
  }

  append(text: string): void {
    this.chunks.push(text);
    this.bytes += Buffer.byteLength(text);
    while (this.bytes > this.capBytes && this.chunks.length > 1) {
      const first = this.chunks.shift()!;
      const len = Buffer.byteLength(first);
      this.bytes -= len;
      this.dropped += len;
    }
  }

  text(): string {
    let body = this.chunks.join('');
    if (Buffer.byteLength(body) > this.capBytes) body = Buffer.from(body).subarray(-this.capBytes).toString('utf8');
    return this.dropped > 0 ? `[... ${this.dropped} earlier bytes of the build log dropped ...]\n${body}` : body;
  }
}
