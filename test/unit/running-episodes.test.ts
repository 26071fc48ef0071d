// What a worker reports of its running episodes (the dashboard's fleet page): each episode's phase
// and start, changes announced, a redelivery's newer run not confused with the older one.
import { describe, expect, it } from 'vitest';
import { RunningEpisodes } from '../../src/episode/running-episodes.ts';

describe('RunningEpisodes', () => {
  it('tracks the phase of each running episode and tells of every change', () => {
    const running = new RunningEpisodes();
    let changes = 0;
    const off = running.onChange(() => (changes += 1));
    const a = running.start('b.t.0', undefined, { batchId: 'b', taskId: 't' });
    expect(running.list()).toEqual([expect.objectContaining({ episodeId: 'b.t.0', batchId: 'b', taskId: 't', phase: 'setup' })]);
    running.setPhase('b.t.0', a, 'agent');
    running.setPhase('b.t.0', a, 'agent'); // no change, no announcement
    expect(running.list()[0]!.phase).toBe('agent');
    expect(running.list()[0]!.phaseStartedAt).toBeGreaterThanOrEqual(running.list()[0]!.startedAt);

    // A redelivery registers a newer run: the older run's phases and end no longer count.
    const newer = running.start('b.t.0');
    running.setPhase('b.t.0', a, 'close');
    running.finish('b.t.0', a);
    expect(running.list()).toEqual([expect.objectContaining({ episodeId: 'b.t.0', phase: 'setup' })]);
    running.finish('b.t.0', newer);
    expect(running.list()).toEqual([]);
    expect(changes).toBe(4); // start, agent, newer start, finish
    off();
    running.start('b.t.1');
    expect(changes).toBe(4);
  });
});
