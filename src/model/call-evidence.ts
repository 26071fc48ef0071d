// Evidence of an episode's model calls: one JSON line per call (request, answer, status, durations,
// attempts), appended in order to a file outside the sandbox. Secrets given to it are replaced before
// a line is written, so even an endpoint that echoes the API key cannot leak it into the evidence.
import { mkdir, open, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import type { TokenCapture } from './token-capture.ts';
import type { UpstreamAttempt } from './upstream.ts';

export type CallOutcome =
  /** The model answered (any status but the retried ones) and the answer went back. */
  | 'answered'
  /** The proxy refused the call itself (path, method, body, budget). */
  | 'refused'
  /** Every upstream attempt failed; the client got 502. */
  | 'upstream_failed'
  /** The client went away or the proxy closed before the answer. */
  | 'aborted';

export interface ModelCallRecord {
  seq: number;
  episodeId: string;
  taskId: string;
  startedAt: string;
  durationMs: number;
  method: string;
  path: string;
  /** HTTP status the client got (0 when it was gone). */
  status: number;
  outcome: CallOutcome;
  /** Why the proxy refused or failed the call. */
  error?: { type: string; message: string };
  /** Tokens charged to the budget for this call. */
  tokens?: number;
  attempts?: UpstreamAttempt[];
  /** The request as parsed (JSON), or its size when it was not JSON or too large. */
  request?: unknown;
  /** The answer as parsed (JSON), or its text when it was not JSON; a stream reassembled into one chat.completion. */
  response?: unknown;
  /** A streamed answer: events relayed, bytes, and when the first event reached the agent. */
  stream?: { events: number; bytes: number; firstEventMs?: number };
  /** Token ids and logprobs the endpoint returned, exactly as it returned them. */
  capture?: TokenCapture;
  /** The endpoint's policy version current when the call started (absent: none was ever set). */
  policyVersion?: number;
  /** `cache`: Redis did not answer at the call's start, the version is this worker's last read. */
  policyVersionSource?: 'cache';
}

const REDACTED = '[redacted]';

export class CallEvidence {
  private chain: Promise<void> = Promise.resolve();
  private closed = false;

  private constructor(
    readonly file: string,
    private readonly handle: FileHandle,
    private readonly secrets: readonly string[],
  ) {}

  /** Open (append) the evidence file, creating its folder. */
  static async open(file: string, secrets: readonly (string | undefined)[]): Promise<CallEvidence> {
    await mkdir(path.dirname(file), { recursive: true });
    const handle = await open(file, 'a', 0o644);
    return new CallEvidence(file, handle, secrets.filter((s): s is string => s !== undefined && s.length > 0));
  }

  private redact(line: string): string {
    let out = line;
    for (const secret of this.secrets) {
      // The secret as JSON.stringify would write it inside a string, and as raw text.
      const escaped = JSON.stringify(secret).slice(1, -1);
      out = out.split(escaped).join(REDACTED);
      if (escaped !== secret) out = out.split(secret).join(REDACTED);
    }
    return out;
  }

  /** Append one record; resolves once it is written. Records are written in call order. */
  append(record: ModelCallRecord): Promise<void> {
    if (this.closed) return Promise.reject(new Error(`call evidence ${this.file} is closed`));
    const line = `${this.redact(JSON.stringify(record))}\n`;
    const write = this.chain.then(async () => {
      await this.handle.appendFile(line, 'utf8');
    });
    this.chain = write.catch(() => undefined);
    return write;
  }

  /** Wait for pending lines, flush them to disk and close the file. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.chain;
    try {
      await this.handle.sync();
    } finally {
      await this.handle.close();
    }
  }
}
