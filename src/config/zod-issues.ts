// Turns zod issues into one line each, naming the field path and the value found there, so a user can
// fix a batch file, task.yaml, job payload or environment variable without reading a stack trace. A
// secret is never echoed: the value of a field named like one is hidden, a URL's password masked. Nor
// is a file's content: a whole document, a list or an object is described by its size, long strings by
// their length, and unknown keys are named a few at a time; control characters are escaped.
import type { z } from 'zod';
import { printable } from '../errors/printable.ts';
import { isSecretName } from './secret-names.ts';

/** `text` with the password of every URL in it masked: `redis://:***@host:6379`. */
export function redactUrlCredentials(text: string): string {
  return text.replace(/([a-z][a-z0-9+.-]*:\/\/[^/\s:@]*:)[^@\s]*@/gi, '$1***@');
}

function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  let cur: unknown = input;
  for (const key of path) {
    if (cur === null || typeof cur !== 'object') return undefined;
    cur = (cur as Record<PropertyKey, unknown>)[key];
  }
  return cur;
}

/** Strings longer than this are described by their size: a value is shown, a document is not. */
const MAX_SHOWN_CHARS = 80;
/** Unknown keys named in one message; a file that is not a task.yaml at all has one per line. */
const MAX_SHOWN_KEYS = 3;

function show(value: unknown, secret: boolean, root: boolean): string {
  if (value === undefined) return 'nothing';
  // JSON has no NaN or Infinity (YAML's .nan and .inf): said as they are, not as null.
  if (typeof value === 'number' && !Number.isFinite(value)) return String(value);
  if (secret) return 'a value, not shown';
  // The whole document: whatever the file is (a linked /etc/passwd), its text is not repeated.
  if (root && typeof value === 'string') return `a string of ${Buffer.byteLength(value)} bytes`;
  if (Array.isArray(value)) return `a list of ${value.length} item${value.length === 1 ? '' : 's'}`;
  if (value !== null && typeof value === 'object') {
    const keys = Object.keys(value).length;
    return `a mapping of ${keys} key${keys === 1 ? '' : 's'}`;
  }
  if (typeof value === 'string' && value.length > MAX_SHOWN_CHARS) return `a string of ${Buffer.byteLength(value)} bytes`;
  // A credential in the wrong field (an API key as a timeout) is described, not shown.
  if (typeof value === 'string' && looksLikeCredential(value)) return `a string of ${Buffer.byteLength(value)} bytes that looks like a credential, not shown`;
  return printable(redactUrlCredentials(JSON.stringify(value) ?? String(value)));
}

/** A value as messages show it: quoted and escaped, cut when long, described (not shown) when it looks like a credential. */
export function shownValue(value: unknown): string {
  return show(value, false, false);
}

/** Well-known key prefixes (OpenAI, Stripe, GitHub, Slack, AWS, GitLab, Hugging Face, JWTs). */
const CREDENTIAL_PREFIX = /^(sk|pk|rk)[-_]|^(ghp|gho|ghu|ghs|ghr|github_pat|glpat|hf)_|^xox[abpr]-|^(AKIA|ASIA)[A-Z0-9]{12}|^eyJ[A-Za-z0-9_-]{10,}/;

/** A value that looks like a key or token: a known prefix, or 24+ characters mixing upper, lower and digits. */
export function looksLikeCredential(value: string): boolean {
  if (CREDENTIAL_PREFIX.test(value)) return true;
  return value.length >= 24 && /^[A-Za-z0-9_\-+/=.]+$/.test(value) && /[a-z]/.test(value) && /[A-Z]/.test(value) && /[0-9]/.test(value);
}

function message(issue: z.core.$ZodIssue): string {
  if (issue.code !== 'unrecognized_keys') return printable(issue.message);
  const named = issue.keys.slice(0, MAX_SHOWN_KEYS).map((k) => printable(JSON.stringify(k.length > 40 ? `${k.slice(0, 37)}...` : k)));
  const more = issue.keys.length > MAX_SHOWN_KEYS ? ` and ${issue.keys.length - MAX_SHOWN_KEYS} more` : '';
  return `Unrecognized key${issue.keys.length === 1 ? '' : 's'}: ${named.join(', ')}${more}`;
}

/** "field.path: message (got value)" for every issue. */
export function describeIssues(error: z.ZodError, input: unknown): string[] {
  return error.issues.map((issue) => {
    const field = issue.path.length > 0 ? printable(issue.path.map(String).join('.')) : '(root)';
    const secret = issue.path.some((key) => typeof key === 'string' && isSecretName(key));
    return `${field}: ${message(issue)} (got ${show(valueAt(input, issue.path), secret, issue.path.length === 0)})`;
  });
}
