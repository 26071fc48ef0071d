// What one checkpoint holds: the agent's state after a turn (transcript, counters) and what became of
// the task workdir's snapshot. The same shape travels through Redis and lands as checkpoint.json.
import { z } from 'zod';
import { EpisodeId } from '../ids/episode-id.ts';

export const CheckpointUsage = z.object({ promptTokens: z.number(), completionTokens: z.number(), totalTokens: z.number() });
export type CheckpointUsage = z.infer<typeof CheckpointUsage>;

/** The file name of a captured workspace, next to checkpoint.json. */
export const WORKSPACE_TAR = 'workspace.tar';
export const CHECKPOINT_JSON = 'checkpoint.json';

export const CheckpointWorkspace = z.discriminatedUnion('captured', [
  z.strictObject({
    captured: z.literal(true),
    /** What `SandboxSession.getArchive(workdir)` returned: entries prefixed with the workdir's base name. */
    file: z.literal(WORKSPACE_TAR),
    bytes: z.number().int().min(0),
    sha256: z.string().regex(/^[0-9a-f]{64}$/),
  }),
  /** e.g. `larger than 8388608 bytes`, `no snapshot offered`, `snapshot failed: ...` */
  z.strictObject({ captured: z.literal(false), reason: z.string().min(1) }),
]);
export type CheckpointWorkspace = z.infer<typeof CheckpointWorkspace>;

/** What the episode runner offers: the agent's `checkpoint` event plus the episode it belongs to. */
export const CheckpointOffer = z.object({
  episodeId: EpisodeId,
  /** Increases with every checkpoint of the episode (the agent uses its turn); the same seq is the same checkpoint. */
  seq: z.number().int().min(0),
  turn: z.number().int().min(0),
  /** The transcript so far. */
  messages: z.array(z.unknown()),
  usage: CheckpointUsage,
  /** Agent time consumed up to this checkpoint, earlier attempts included. */
  agentMs: z.number().min(0),
  /** When the agent emitted it. @default the time of the offer */
  createdAt: z.iso.datetime().optional(),
});
export type CheckpointOffer = z.infer<typeof CheckpointOffer>;

export const Checkpoint = z.strictObject({
  ...CheckpointOffer.shape,
  createdAt: z.iso.datetime(),
  workspace: CheckpointWorkspace,
});
export type Checkpoint = z.infer<typeof Checkpoint>;

/** Folder name of a seq: zero-padded so a plain listing sorts. */
export const seqFolderName = (seq: number) => String(seq).padStart(8, '0');
export const SEQ_FOLDER = /^\d{8,}$/;
