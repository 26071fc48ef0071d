// Server-Sent Events as OpenAI-compatible endpoints stream chat completions: `data: <json>` events
// separated by a blank line, ending with `data: [DONE]`. The parser is incremental (bytes in, whole
// events out), accepts \n, \r\n and \r line ends, joins multi-line data, and ignores comments.

export interface SseEvent {
  /** The data lines, joined with \n. */
  data: string;
  /** The `event:` field, when the server sent one. */
  event?: string;
  /** The `id:` field, when the server sent one. */
  id?: string;
}

/** The data of the event that ends an OpenAI stream. */
export const SSE_DONE = '[DONE]';

export class SseParser {
  private buffer = '';
  private data: string[] = [];
  private event: string | undefined;
  private id: string | undefined;
  private readonly decoder = new TextDecoder('utf-8');
  /** Characters held for a line not yet ended; a line longer than `maxLineChars` is an error. */
  constructor(private readonly maxLineChars = 16 * 1024 * 1024) {}

  /** Feed bytes; returns the events they completed. Throws when one line grows past the limit. */
  push(chunk: Uint8Array): SseEvent[] {
    this.buffer += this.decoder.decode(chunk, { stream: true });
    const events: SseEvent[] = [];
    let start = 0;
    for (;;) {
      const match = /\r\n|\n|\r/g;
      match.lastIndex = start;
      const found = match.exec(this.buffer);
      // A lone \r at the very end may be the first half of \r\n: wait for the next byte.
      if (found === null || (found[0] === '\r' && found.index === this.buffer.length - 1)) break;
      this.line(this.buffer.slice(start, found.index), events);
      start = found.index + found[0].length;
    }
    this.buffer = this.buffer.slice(start);
    if (this.buffer.length > this.maxLineChars) throw new Error(`an event-stream line is longer than ${this.maxLineChars} characters`);
    return events;
  }

  /** The stream ended: a held lone \r ends its line. Returns the events that completes. */
  end(): SseEvent[] {
    const events: SseEvent[] = [];
    if (this.buffer.endsWith('\r')) {
      this.line(this.buffer.slice(0, -1), events);
      this.buffer = '';
    }
    return events;
  }

  /** Whether bytes of an unfinished event are held (a stream that ends now was cut mid-event). */
  get pending(): boolean {
    return this.buffer.length > 0 || this.data.length > 0;
  }

  private line(line: string, events: SseEvent[]): void {
    if (line === '') {
      if (this.data.length > 0) {
        events.push({ data: this.data.join('\n'), ...(this.event !== undefined && { event: this.event }), ...(this.id !== undefined && { id: this.id }) });
      }
      this.data = [];
      this.event = undefined;
      return;
    }
    if (line.startsWith(':')) return;
    const colon = line.indexOf(':');
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? '' : line.slice(colon + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') this.data.push(value);
    else if (field === 'event') this.event = value;
    else if (field === 'id') this.id = value;
  }
}

/** One event as written to a client. */
export function formatSse(data: string): string {
  return `data: ${data}\n\n`;
}
