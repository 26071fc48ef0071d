// What the model proxy puts into each request before it goes upstream, from the episode's endpoint
// and its batch's `model`: the model name (forced, or filled in when the agent names none) and the
// batch's sampling parameters (filled in where the agent omits them; overwriting them with `enforce`).
// One function for every route that relays a model call.

export interface RequestOverrides {
  /** Put in every request, whatever the agent asked for (the endpoint's model, or the batch's with `enforce`). */
  forceModel?: string | undefined;
  /** Put in a request that names no model. */
  defaultModel?: string | undefined;
  /** The batch's sampling parameters, by their request names. */
  sampling?: Readonly<Record<string, unknown>> | undefined;
  /** Sampling overwrites the agent's values instead of only filling in missing ones. */
  enforce?: boolean | undefined;
}

/** `body` with the overrides applied (a new object; `body` is not changed). */
export function applyOverrides(body: Record<string, unknown>, o: RequestOverrides): Record<string, unknown> {
  const out: Record<string, unknown> = { ...body };
  if (o.forceModel !== undefined) out.model = o.forceModel;
  else if ((out.model === undefined || out.model === null || out.model === '') && o.defaultModel !== undefined) out.model = o.defaultModel;
  for (const [key, value] of Object.entries(o.sampling ?? {})) {
    if (value === undefined) continue;
    if (o.enforce === true || out[key] === undefined || out[key] === null) out[key] = value;
  }
  return out;
}

/** Whether any override would change a request. */
export function hasOverrides(o: RequestOverrides): boolean {
  return o.forceModel !== undefined || o.defaultModel !== undefined || Object.keys(o.sampling ?? {}).length > 0;
}
