// Job data as the dashboard shows it: values under keys that name a secret are replaced, at any depth,
// so an API key put into a payload by mistake is not shown to everyone who can open Bull Board.
// Secrets, not settings: contextWindowTokens and maxTokens stay readable (the names are the ones
// error messages hide, one definition in config/secret-names.ts).
import { isSecretName } from '../config/secret-names.ts';

export const REDACTED = '[redacted]';

/** A copy of `value` with every property named like a secret (isSecretName) replaced by REDACTED. */
export function redactSecrets(value: unknown): unknown {
  return redact(value, new WeakSet());
}

function redact(value: unknown, seen: WeakSet<object>): unknown {
  if (value === null || typeof value !== 'object') return value;
  if (seen.has(value)) return '[circular]';
  seen.add(value);
  if (Array.isArray(value)) return value.map((v) => redact(v, seen));
  return Object.fromEntries(
    Object.entries(value).map(([k, v]) => [k, isSecretName(k) ? REDACTED : redact(v, seen)]),
  );
}
