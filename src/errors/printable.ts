// Makes text safe to print on a terminal or in a log line: a path or value from a user's file may hold
// newlines (a forged extra line), ANSI escapes (recolour or clear the screen) or bidi controls (text
// shown in another order). Each such character is written as an escape instead; the rest is kept.
/** C0 controls, DEL, C1 controls, the line and paragraph separators and the bidi controls. */
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

function escapeOne(ch: string): string {
  switch (ch) {
    case '\n': return '\\n';
    case '\r': return '\\r';
    case '\t': return '\\t';
    default: {
      const code = ch.charCodeAt(0);
      return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
    }
  }
}

/** `text` with every control character escaped, newlines included: for one path or value. */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, escapeOne);
}

/** `text` with every control character escaped but the newlines between its lines: for a whole message. */
export function printableLines(text: string): string {
  return text.split('\n').map(printable).join('\n');
}
