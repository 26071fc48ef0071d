// The event protocol between the reference agent (in the sandbox) and the worker: one JSON object per
// line on the agent's stdout, behind a marker. Anything else on stdout is junk and ignored; a line cut
// off by the agent dying is dropped, never half-parsed.
import { z } from 'zod';

export const EVENT_MARKER = '@@rollout-event@@ ';
/** Longer lines are dropped (a checkpoint of a huge transcript must not take the worker's memory). */
export const MAX_EVENT_LINE_BYTES = 8 * 1024 * 1024;

const count = z.number().int().min(0);
const Usage = z.object({ promptTokens: count, completionTokens: count, totalTokens: count });

export const AgentEvent = z.discriminatedUnion('type', [
  z.object({ type: z.literal('model_call'), turn: z.number().int(), durationMs: z.number(), usage: Usage, finishReason: z.string().nullable() }),
  z.object({ type: z.literal('tool_call'), turn: z.number().int(), name: z.string(), ok: z.boolean(), exitCode: z.number().int().nullable().optional(), durationMs: z.number() }),
  z.object({
    type: z.literal('checkpoint'),
    seq: count,
    turn: count,
    messages: z.array(z.unknown()),
    usage: Usage,
    agentMs: z.number().min(0),
  }),
  z.object({ type: z.literal('final'), reason: z.enum(['finished', 'stopped', 'max_turns', 'context', 'budget']), answer: z.string().nullable(), turns: z.number().int() }),
  z.object({ type: z.literal('error'), kind: z.enum(['model', 'agent']), message: z.string() }),
]);
export type AgentEvent = z.infer<typeof AgentEvent>;

/** One line for stdout. */
export function formatEvent(event: AgentEvent): string {
  return `${EVENT_MARKER}${JSON.stringify(event)}\n`;
}

/** Feeds stdout chunks, calls back with every well-formed event, counts what it dropped. */
export class AgentEventParser {
  private pending: Buffer[] = [];
  private pendingBytes = 0;
  private skipping = false;
  dropped = 0;

  constructor(private readonly onEvent: (event: AgentEvent) => void) {}

  push(chunk: Buffer): void {
    let start = 0;
    for (let nl = chunk.indexOf(10, start); nl !== -1; nl = chunk.indexOf(10, start)) {
      this.append(chunk.subarray(start, nl));
      this.line();
      start = nl + 1;
    }
    this.append(chunk.subarray(start));
  }

  private append(part: Buffer): void {
    if (this.skipping || part.length === 0) return;
    this.pendingBytes += part.length;
    if (this.pendingBytes > MAX_EVENT_LINE_BYTES) {
      this.skipping = true;
      this.pending = [];
      return;
    }
    this.pending.push(part);
  }

  private line(): void {
    const skipped = this.skipping;
    const text = Buffer.concat(this.pending).toString('utf8');
    this.pending = [];
    this.pendingBytes = 0;
    this.skipping = false;
    if (skipped) {
      this.dropped += 1;
      return;
    }
    const at = text.indexOf(EVENT_MARKER);
    if (at === -1) return;
    try {
      const parsed = AgentEvent.safeParse(JSON.parse(text.slice(at + EVENT_MARKER.length)));
      if (parsed.success) this.onEvent(parsed.data);
      else this.dropped += 1;
    } catch {
      this.dropped += 1;
    }
  }
}
