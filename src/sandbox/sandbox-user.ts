// The non-root user every process the sandbox session starts runs as, apart so that the agents, the
// model proxy and the sweep script can name it without loading the session.

/** The user every process in the sandbox runs as; files copied in are owned by it. */
export const SANDBOX_USER = { uid: 1000, gid: 1000 } as const;
/** SANDBOX_USER as the engine's `User` field of an exec takes it. */
export const SANDBOX_USER_SPEC = `${SANDBOX_USER.uid}:${SANDBOX_USER.gid}`;
