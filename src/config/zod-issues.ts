// Turns zod issues into one line each, naming the field path and the value found there, so a user can
// fix a batch file, task.yaml, job payload or environment variable without reading a stack trace. A
// secret is never echoed: the value of a field named like one is hidden, a URL's password masked.
import type { z } from 'zod';
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

function show(value: unknown, secret: boolean): string {
  if (value === undefined) return 'nothing';
  if (secret) return 'a value, not shown';
  const json = redactUrlCredentials(JSON.stringify(value));
  return json.length > 80 ? `${json.slice(0, 77)}...` : json;
}

/** "field.path: message (got value)" for every issue. */
export function describeIssues(error: z.ZodError, input: unknown): string[] {
  return error.issues.map((issue) => {
    const field = issue.path.length > 0 ? issue.path.join('.') : '(root)';
    const secret = issue.path.some((key) => typeof key === 'string' && isSecretName(key));
    return `${field}: ${issue.message} (got ${show(valueAt(input, issue.path), secret)})`;
  });
}
