// An attempt's transcript as the page shows it, from its evidence files: the conversation of
// trajectory.json (or, when the attempt never closed, rebuilt from model-calls.jsonl) as a list of
// items — messages, assistant turns with their timing, tokens and tool calls (each with the output of
// the `tool` message that answers it), the checkpoints the reference agent took and where a resumed
// attempt picked up — plus the agent's and the verifier's output, the result and the workspace diff.
// Pure: no I/O, no markup. Every file is the agent's to fill: nothing is trusted to have a shape.
import { EpisodeResult } from '../episode/episode-job.ts';
import { AgentEvent, EVENT_MARKER } from '../agent/reference/agent-events.ts';
import { buildTrajectory, type TrajectoryTurn } from '../evidence/trajectory.ts';
import type { ModelCallRecord } from '../model/call-evidence.ts';
import { redactSecrets } from './redact.ts';
import type { AttemptFiles, ReadFile } from './transcript-evidence.ts';

type Json = Record<string, unknown>;
const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);
const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) ? v : undefined);
const str = (v: unknown): string | undefined => (typeof v === 'string' ? v : undefined);

export interface ToolCallView {
  id: string;
  name: string;
  /** `function.arguments` as sent. */
  rawArguments: string;
  /** The arguments parsed (secret-named keys redacted), when they are a JSON object. */
  arguments?: Json;
  /** The content of the `tool` message answering this call, when there is one. */
  output?: unknown;
  /** The reference agent's tool_call event: whether it worked, its exit code and duration. */
  event?: { ok: boolean; exitCode: number | null | undefined; durationMs: number };
}

export interface TurnTiming {
  seq: number;
  startedAt: string;
  durationMs: number;
  streamed: boolean;
  finishReason: string | undefined;
  promptTokens?: number;
  completionTokens?: number;
  totalTokens?: number;
  /** Completion token ids the endpoint returned (token capture). */
  tokenIds?: number;
}

export type TranscriptItem =
  /** Any message but an answer of this attempt's model calls (an assistant message from a checkpoint keeps its tool calls). */
  | { kind: 'message'; index: number; role: string; message: Json; toolCalls: ToolCallView[] }
  /** An assistant message that a model call of this attempt answered. */
  | { kind: 'turn'; index: number; number: number; timing: TurnTiming; message: Json; toolCalls: ToolCallView[] }
  /** Messages this attempt started with, from the checkpoint of an earlier attempt. */
  | { kind: 'inherited'; seq: number; items: TranscriptItem[] }
  | { kind: 'resumed'; seq: number }
  | { kind: 'checkpoint'; seq: number; turn: number };

export interface AttemptTranscript {
  attempt: number;
  result?: EpisodeResult;
  /** Where the conversation came from; undefined when the attempt has none (no model, or no call). */
  source?: 'trajectory.json' | 'model-calls.jsonl';
  notes: string[];
  calls?: Record<string, number>;
  items: TranscriptItem[];
  /** Turns whose prompt was not a prefix of the final conversation (the agent rewrote its history). */
  offPath: Array<Extract<TranscriptItem, { kind: 'turn' }> & { prompt: unknown[] }>;
  turnCount: number;
  totals: { modelMs: number; promptTokens: number; completionTokens: number };
  agentStdout?: ReadFile & { hiddenEventLines: number };
  agentStderr?: ReadFile;
  verifierStdout?: ReadFile;
  verifierStderr?: ReadFile;
  diff?: ReadFile;
  /** takenAt: when the workspace was copied ('agent-stopped', or 'close': after the verifier). */
  changes?: { added: string[]; removed: string[]; modified: string[]; takenAt?: string };
}

const MiB = (n: number) => `${(n / 1024 / 1024).toFixed(1)} MiB`;

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

interface ParsedTrajectory {
  messages: unknown[];
  turns: TrajectoryTurn[];
  calls?: Record<string, number>;
}

function conversationOf(files: AttemptFiles['files'], meta: { episodeId: string; taskId: string; attempt: number }, notes: string[]): (ParsedTrajectory & { source: AttemptTranscript['source'] }) | undefined {
  const traj = files['trajectory.json'];
  if (traj !== undefined) {
    if (traj.truncated) {
      notes.push(`trajectory.json is ${MiB(traj.sizeBytes)}, more than this page reads: see the evidence files.`);
      return undefined;
    }
    const parsed = parseJson(traj.text);
    if (!isObject(parsed) || !Array.isArray(parsed.messages) || !Array.isArray(parsed.turns)) {
      notes.push('trajectory.json is not a trajectory.');
      return undefined;
    }
    const calls = isObject(parsed.calls) ? Object.fromEntries(Object.entries(parsed.calls).filter(([, v]) => num(v) !== undefined)) as Record<string, number> : undefined;
    return { source: 'trajectory.json', messages: parsed.messages, turns: parsed.turns.filter(isObject) as unknown as TrajectoryTurn[], ...(calls && { calls }) };
  }
  const calls = files['model-calls.jsonl'];
  if (calls === undefined) return undefined;
  // The attempt did not close (its worker was lost): the trajectory as close would have written it.
  const lines = calls.text.split('\n');
  if (calls.truncated) {
    lines.pop();
    notes.push(`model-calls.jsonl is ${MiB(calls.sizeBytes)}: only its first calls are shown.`);
  }
  const records = lines.flatMap((line) => {
    const r = line === '' ? undefined : parseJson(line);
    return isObject(r) && typeof r.path === 'string' && typeof r.outcome === 'string' ? [r as unknown as ModelCallRecord] : [];
  });
  notes.push('No trajectory.json (the attempt did not close): the conversation is rebuilt from model-calls.jsonl.');
  const t = buildTrajectory(records, meta);
  return { source: 'model-calls.jsonl', messages: t.messages, turns: t.turns, calls: t.calls };
}

interface AgentEvents {
  modelCalls: Array<Extract<AgentEvent, { type: 'model_call' }>>;
  toolCalls: Map<number, Array<Extract<AgentEvent, { type: 'tool_call' }>>>;
  /** seq, turn and the length of the conversation at the checkpoint. */
  checkpoints: Array<{ seq: number; turn: number; messages: number }>;
  /** The conversation of the newest checkpoint: it holds the outputs of the last turn's tools, which no model call saw. */
  lastMessages: unknown[];
}

/** The reference agent's events in its stdout, and the stdout without them (they are the protocol, not output). */
function agentEvents(stdout: string): { events: AgentEvents; rest: string; hidden: number } {
  const events: AgentEvents = { modelCalls: [], toolCalls: new Map(), checkpoints: [], lastMessages: [] };
  const rest: string[] = [];
  let hidden = 0;
  for (const line of stdout.split('\n')) {
    const at = line.indexOf(EVENT_MARKER);
    if (at === -1) {
      rest.push(line);
      continue;
    }
    hidden += 1;
    const parsed = AgentEvent.safeParse(parseJson(line.slice(at + EVENT_MARKER.length)));
    if (!parsed.success) continue;
    const e = parsed.data;
    if (e.type === 'model_call') events.modelCalls.push(e);
    else if (e.type === 'tool_call') events.toolCalls.set(e.turn, [...(events.toolCalls.get(e.turn) ?? []), e]);
    else if (e.type === 'checkpoint') {
      events.checkpoints.push({ seq: e.seq, turn: e.turn, messages: e.messages.length });
      events.lastMessages = e.messages;
    }
  }
  return { events, rest: rest.join('\n'), hidden };
}

function timingOf(turn: TrajectoryTurn): TurnTiming {
  const usage = isObject(turn.usage) ? turn.usage : {};
  const tokens = {
    promptTokens: num(usage.prompt_tokens),
    completionTokens: num(usage.completion_tokens),
    totalTokens: num(usage.total_tokens),
    tokenIds: Array.isArray(turn.completionTokenIds) ? turn.completionTokenIds.length : undefined,
  };
  return {
    seq: num(turn.seq) ?? -1,
    startedAt: str(turn.startedAt) ?? '',
    durationMs: num(turn.durationMs) ?? 0,
    streamed: turn.streamed === true,
    finishReason: str(turn.finishReason),
    ...Object.fromEntries(Object.entries(tokens).filter(([, v]) => v !== undefined)),
  };
}

function toolCallsOf(message: Json): ToolCallView[] {
  if (!Array.isArray(message.tool_calls)) return [];
  return message.tool_calls.filter(isObject).map((call) => {
    const fn = isObject(call.function) ? call.function : {};
    const rawArguments = typeof fn.arguments === 'string' ? fn.arguments : JSON.stringify(fn.arguments ?? null);
    const parsed = parseJson(rawArguments);
    return {
      id: str(call.id) ?? '',
      name: str(fn.name) ?? '(no name)',
      rawArguments,
      ...(isObject(parsed) && { arguments: redactSecrets(parsed) as Json }),
    };
  });
}

export function buildAttemptTranscript(files: AttemptFiles, meta: { episodeId: string; taskId: string }): AttemptTranscript {
  const f = files.files;
  const notes: string[] = [];
  const resultParse = f['result.json'] === undefined ? undefined : EpisodeResult.safeParse(parseJson(f['result.json'].text));
  const result = resultParse?.success ? resultParse.data : undefined;
  if (f['result.json'] === undefined) notes.push('No result.json: the attempt did not finish (its worker stopped or was lost).');
  else if (result === undefined) notes.push('result.json is not a result.');

  // The reference agent's events: only for it (any other agent may print the marker at will).
  const isReference = result?.provenance.agent.kind === 'llm';
  const stdout = f['agent.stdout.txt'];
  const parsedOut = stdout !== undefined && isReference ? agentEvents(stdout.text) : undefined;
  const events = parsedOut?.events;

  const out: AttemptTranscript = {
    attempt: files.attempt,
    ...(result && { result }),
    notes,
    items: [],
    offPath: [],
    turnCount: 0,
    totals: { modelMs: 0, promptTokens: 0, completionTokens: 0 },
    ...(stdout && { agentStdout: { ...stdout, text: parsedOut?.rest ?? stdout.text, hiddenEventLines: parsedOut?.hidden ?? 0 } }),
    ...(f['agent.stderr.txt'] && { agentStderr: f['agent.stderr.txt'] }),
    ...(f['verifier.stdout.txt'] && { verifierStdout: f['verifier.stdout.txt'] }),
    ...(f['verifier.stderr.txt'] && { verifierStderr: f['verifier.stderr.txt'] }),
    ...(f['workspace.diff'] && { diff: f['workspace.diff'] }),
  };
  const evidence = f['evidence.json'] && parseJson(f['evidence.json'].text);
  const workspace = isObject(evidence) && isObject(evidence.workspace) ? evidence.workspace : undefined;
  if (workspace) {
    const list = (v: unknown) => (Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : []);
    out.changes = {
      added: list(workspace.added), removed: list(workspace.removed), modified: list(workspace.modified),
      ...(typeof workspace.takenAt === 'string' && { takenAt: workspace.takenAt }),
    };
  }

  const conv = conversationOf(f, { ...meta, attempt: files.attempt }, notes);
  if (conv === undefined) {
    if (result?.resumedFrom !== undefined) out.items.push({ kind: 'resumed', seq: result.resumedFrom });
    return out;
  }
  out.source = conv.source;
  if (conv.calls) out.calls = conv.calls;
  // The reference agent's last tools ran after its last model call: their outputs are in its newest
  // checkpoint only. Added when that checkpoint continues this conversation (the same roles up to its end).
  const last = events?.lastMessages ?? [];
  const continues = last.length > conv.messages.length && conv.messages.every((m, i) => isObject(m) && isObject(last[i]) && m.role === last[i].role);
  const messages = continues ? [...conv.messages, ...last.slice(conv.messages.length)] : conv.messages;
  out.turnCount = conv.turns.length;

  // Each turn with the reference agent's events of the same call: its model_call events come in the
  // order of the answered calls, and its tool_call events carry that call's turn number.
  const eventsMatch = events !== undefined && events.modelCalls.length === conv.turns.length;
  const turnAt = new Map<number, { turn: TrajectoryTurn; j: number }>();
  conv.turns.forEach((turn, j) => {
    const at = num(turn.messageIndex);
    if (at !== undefined && at >= 0 && at < messages.length) turnAt.set(at, { turn, j });
  });
  const withEvents = (calls: ToolCallView[], j: number): ToolCallView[] => {
    const tools = eventsMatch && events ? events.toolCalls.get(events.modelCalls[j]!.turn) : undefined;
    if (tools === undefined || tools.length !== calls.length) return calls;
    return calls.map((c, k) => ({ ...c, event: { ok: tools[k]!.ok, exitCode: tools[k]!.exitCode, durationMs: tools[k]!.durationMs } }));
  };
  const count = (timing: TurnTiming) => {
    out.totals.modelMs += timing.durationMs;
    out.totals.promptTokens += timing.promptTokens ?? 0;
    out.totals.completionTokens += timing.completionTokens ?? 0;
  };

  const consumed = new Set<number>();
  /** The tool message answering call `id` of the assistant message at `from`: before the next assistant message. */
  const outputOf = (from: number, id: string): unknown => {
    for (let k = from + 1; k < messages.length; k += 1) {
      const m = messages[k];
      if (!isObject(m) || m.role === 'assistant') return undefined;
      if (m.role === 'tool' && m.tool_call_id === id && !consumed.has(k)) {
        consumed.add(k);
        return m.content ?? null;
      }
    }
    return undefined;
  };

  let assistantTurns = 0;
  const items: TranscriptItem[] = [];
  const checkpointsAt = new Map<number, Array<{ seq: number; turn: number }>>();
  for (const cp of events?.checkpoints ?? []) {
    const at = Math.min(cp.messages, messages.length);
    checkpointsAt.set(at, [...(checkpointsAt.get(at) ?? []), cp]);
  }
  const marks = (at: number) => (checkpointsAt.get(at) ?? []).map((cp): TranscriptItem => ({ kind: 'checkpoint', seq: cp.seq, turn: cp.turn }));
  items.push(...marks(0));
  messages.forEach((raw, index) => {
    const message = isObject(raw) ? raw : { role: '(not a message)', content: JSON.stringify(raw) };
    const role = str(message.role) ?? '(no role)';
    if (role === 'assistant') assistantTurns += 1;
    if (!consumed.has(index)) {
      const turn = turnAt.get(index);
      const calls = toolCallsOf(message).map((c) => {
        const output = c.id === '' ? undefined : outputOf(index, c.id);
        return output === undefined ? c : { ...c, output };
      });
      if (turn !== undefined) {
        const timing = timingOf(turn.turn);
        count(timing);
        items.push({ kind: 'turn', index, number: assistantTurns, timing, message, toolCalls: withEvents(calls, turn.j) });
      } else {
        items.push({ kind: 'message', index, role, message, toolCalls: calls });
      }
    }
    items.push(...marks(index + 1));
  });
  out.items = items;

  // The turns whose prompt was another conversation: after it, with their own prompt.
  conv.turns.forEach((turn, j) => {
    const at = num(turn.messageIndex);
    if (at !== undefined && turnAt.get(at)?.j === j) return;
    const message = isObject(turn.message) ? turn.message : { role: 'assistant', content: JSON.stringify(turn.message ?? null) };
    const timing = timingOf(turn);
    count(timing);
    out.offPath.push({ kind: 'turn', index: -1, number: j + 1, timing, message, toolCalls: withEvents(toolCallsOf(message), j), prompt: Array.isArray(turn.prompt) ? turn.prompt : [] });
  });

  // A resumed attempt: what it started with came from the checkpoint, up to its first call's answer.
  if (result?.resumedFrom !== undefined) {
    const firstTurn = out.items.findIndex((i) => i.kind === 'turn');
    const split = firstTurn === -1 ? out.items.length : firstTurn;
    const inherited = out.items.slice(0, split);
    out.items = [
      ...(inherited.length > 0 ? [{ kind: 'inherited' as const, seq: result.resumedFrom, items: inherited }] : []),
      { kind: 'resumed', seq: result.resumedFrom },
      ...out.items.slice(split),
    ];
  }
  return out;
}
