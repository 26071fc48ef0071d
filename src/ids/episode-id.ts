// The one shape of an episode id (and of a batch id): what job ids, evidence and checkpoint folders,
// and the dashboard's routes all accept. A leaf in a folder of its own: queue contracts, checkpoints
// and the episode runner all name episodes, and none should import another's folder only for this.
import { z } from 'zod';

export const EPISODE_ID_PATTERN = /^[a-z0-9][a-z0-9_.-]{0,199}$/;

export const EpisodeId = z.string().regex(EPISODE_ID_PATTERN, 'lower-case letters, digits, ., - and _');
