// Job data as the dashboard shows it: values under keys that name a secret are replaced, at any depth,
// so an API key put into a payload by mistake is not shown to everyone who can open Bull Board.

// Broader than what error messages hide: any key that mentions a secret (maxTokens included).
export const SECRET_KEY = /key|token|secret|password|authorization/i;
export const REDACTED = '[redacted]';

/** A copy of `value` with every property whose name matches SECRET_KEY replaced by REDACTED. */
export function redactSecrets(value: unknown): unknown {
  return redact(value, new WeakSet());
}

function redact(value: unknown, seen: WeakSet<object>): unknown {
  if (value === null || typeof value !== 'object') return value;
  if (seen.has(value)) return '[circular]';
  seen.add(value);
  if (Array.isArray(value)) return value.map((v) => redact(v, seen));
  return Object.fromEntries(
    Object.entries(value).map(([k, v]) => [k, SECRET_KEY.test(k) ? REDACTED : redact(v, seen)]),
  );
}
