// Counts the kernel's OOM kills in one sandbox from the engine's event stream. The container's
// State.OOMKilled is set only when its init was the victim; an agent's child killed for memory shows
// up only as an `oom` event (the engine forwards every OOM of the container's cgroup). The same stream
// tells of the container's `die`: under gVisor an OOM kill takes the whole sandbox, and the engine
// never ends the streams of the execs that were running in it (runc's end with their processes).
import type { Readable } from 'node:stream';
import type Docker from 'dockerode';
import { dockerCall, type CallOptions } from './docker-client.ts';

export interface OomWatch {
  /** OOM events seen so far. */
  readonly count: number;
  /** Call `listener` at the container's next `die` (its processes are gone); returns its removal. */
  onDie(listener: () => void): () => void;
  /** Close the stream (idempotent). */
  stop(): void;
}

/** Subscribe before the container starts, so no kill can happen unseen; stop() when done with the sandbox. */
export async function watchOomEvents(docker: Docker, containerId: string, call: CallOptions): Promise<OomWatch> {
  // The stream outlives this call: its own abort ends it, not the call's deadline.
  const lifetime = new AbortController();
  const stream = (await dockerCall('watch oom events', call, () =>
    docker.getEvents({ filters: { container: [containerId], event: ['oom', 'die'] }, abortSignal: lifetime.signal } as Docker.GetEventsOptions),
  ).catch((err: unknown) => {
    // A stream that arrives after the deadline is closed, not leaked.
    lifetime.abort();
    throw err;
  })) as unknown as Readable;
  let count = 0;
  let rest = '';
  const dieListeners = new Set<() => void>();
  stream.on('data', (chunk: Buffer) => {
    // One JSON object per line; a chunk may end mid-line.
    const lines = (rest + chunk.toString('utf8')).split('\n');
    rest = lines.pop() ?? '';
    for (const line of lines) {
      if (/"(status|Action)":"oom"/.test(line)) count += 1;
      else if (/"(status|Action)":"die"/.test(line)) for (const listener of [...dieListeners]) listener();
    }
  });
  // An engine restart or a stop ends the stream; what was counted stays.
  stream.on('error', () => undefined);
  return {
    get count() {
      return count;
    },
    onDie(listener) {
      dieListeners.add(listener);
      return () => dieListeners.delete(listener);
    },
    stop() {
      dieListeners.clear();
      lifetime.abort();
      stream.destroy();
    },
  };
}
