// Captures a process's output with a hard cap: keeps the first and the last half of the cap and
// counts everything, so a sandbox printing gigabytes costs the worker a fixed amount of memory.
import { Writable } from 'node:stream';

export interface CapturedOutput {
  /** What was kept: all of it, or the head and tail with a marker between. */
  text: string;
  totalBytes: number;
  truncated: boolean;
  capBytes: number;
}

export class OutputCapture {
  private head: Buffer[] = [];
  private headBytes = 0;
  private tail: Buffer[] = [];
  private tailBytes = 0;
  private total = 0;
  readonly writable: Writable;

  constructor(private readonly capBytes: number) {
    this.writable = new Writable({
      write: (chunk: Buffer, _enc, cb) => {
        this.push(chunk);
        cb();
      },
    });
  }

  private push(chunk: Buffer): void {
    this.total += chunk.length;
    const headCap = Math.floor(this.capBytes / 2);
    if (this.headBytes < headCap) {
      const take = chunk.subarray(0, headCap - this.headBytes);
      this.head.push(take);
      this.headBytes += take.length;
      chunk = chunk.subarray(take.length);
    }
    if (chunk.length === 0) return;
    const tailCap = this.capBytes - headCap;
    this.tail.push(chunk.length > tailCap ? chunk.subarray(chunk.length - tailCap) : chunk);
    this.tailBytes += Math.min(chunk.length, tailCap);
    while (this.tailBytes > tailCap && this.tail.length > 0) {
      const first = this.tail[0]!;
      const excess = this.tailBytes - tailCap;
      if (first.length <= excess) {
        this.tail.shift();
        this.tailBytes -= first.length;
      } else {
        this.tail[0] = first.subarray(excess);
        this.tailBytes -= excess;
      }
    }
  }

  result(): CapturedOutput {
    const truncated = this.total > this.headBytes + this.tailBytes;
    const head = Buffer.concat(this.head).toString('utf8');
    const tail = Buffer.concat(this.tail).toString('utf8');
    const text = truncated
      ? `${head}\n[... ${this.total - this.headBytes - this.tailBytes} bytes not kept ...]\n${tail}`
      : head + tail;
    return { text, totalBytes: this.total, truncated, capBytes: this.capBytes };
  }
}
