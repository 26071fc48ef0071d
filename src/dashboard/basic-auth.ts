// HTTP Basic authentication of the dashboard. Both fields are compared in constant time (over their
// sha256, so neither the length nor the first differing byte of the secret shows in the timing).
import { createHash, timingSafeEqual } from 'node:crypto';
import type { RequestHandler } from 'express';

export interface Credentials {
  user: string;
  password: string;
}

const digest = (text: string) => createHash('sha256').update(text, 'utf8').digest();

/** Whether an Authorization header carries exactly these credentials. */
export function checkBasicAuth(header: string | undefined, expected: Credentials): boolean {
  const match = /^Basic ([A-Za-z0-9+/=]+)$/i.exec(header?.trim() ?? '');
  const decoded = match?.[1] === undefined ? '' : Buffer.from(match[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  const user = colon < 0 ? '' : decoded.slice(0, colon);
  const password = colon < 0 ? '' : decoded.slice(colon + 1);
  // Both comparisons always run: no early exit on a wrong user name.
  const userOk = timingSafeEqual(digest(user), digest(expected.user));
  const passwordOk = timingSafeEqual(digest(password), digest(expected.password));
  return match !== null && colon >= 0 && userOk && passwordOk;
}

export function basicAuth(expected: Credentials, realm = 'rollout-fleet'): RequestHandler {
  return (req, res, next) => {
    if (checkBasicAuth(req.headers.authorization, expected)) return next();
    res.set('WWW-Authenticate', `Basic realm="${realm}", charset="UTF-8"`).status(401).type('text/plain').send('authentication required\n');
  };
}
