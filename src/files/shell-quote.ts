// One way to put a string into a `sh -c` command line as a single word.

/** `s` in single quotes, its own single quotes escaped: sh reads it back as exactly `s`. */
export const shellQuote = (s: string): string => `'${s.replace(/'/g, `'\\''`)}'`;
