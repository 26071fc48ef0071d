// The tar the end of the turn writes and reads, and nothing more: ustar headers, with pax records for
// what does not fit them (a name or link over 100 bytes, an owner id past 7 octal digits), GNU long
// names read too. Plain functions over buffers, no streams: the program in the sandbox has no stream
// error to miss (a destroyed tar-stream entry's unheard error once crashed it on a cut copy), and the
// copy knows a file's size before it reads it, so one that would pass the cap is not read at all.
// (Its start is no faster for it: 43-44 ms either way as CommonJS in a half-CPU sandbox.) Writing:
// only folders, regular files and symbolic links (what a workspace copy holds). Reading: the tests'
// tar the worker made (TaskArchive.partAsTar), whole in memory.

export const BLOCK = 512;
/** The end of an archive: two zero blocks. */
export const TAR_END = Buffer.alloc(2 * BLOCK);
/** The largest size a ustar header holds (11 octal digits); a bigger file is never written. */
export const MAX_USTAR_SIZE = 0o77777777777;
const MAX_ID = 0o7777777;

export type TarType = 'file' | 'directory' | 'symlink' | 'link' | 'other';

export interface TarHeader {
  name: string;
  type: TarType;
  mode: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch. */
  mtime: number;
  size: number;
  linkname?: string;
}

const TYPE_FLAG: Record<Exclude<TarType, 'other'>, string> = { file: '0', link: '1', symlink: '2', directory: '5' };

function octal(n: number, width: number): string {
  return `${Math.max(0, Math.floor(n)).toString(8).padStart(width - 1, '0')}\0`;
}

function ustar(h: { name: string; type: string; mode: number; uid: number; gid: number; mtime: number; size: number; linkname: string }): Buffer {
  const b = Buffer.alloc(BLOCK);
  b.write(h.name, 0, 100, 'utf8');
  b.write(octal(h.mode & 0o7777, 8), 100, 'ascii');
  b.write(octal(Math.min(h.uid, MAX_ID), 8), 108, 'ascii');
  b.write(octal(Math.min(h.gid, MAX_ID), 8), 116, 'ascii');
  b.write(octal(h.size, 12), 124, 'ascii');
  b.write(octal(Math.min(h.mtime, MAX_USTAR_SIZE), 12), 136, 'ascii');
  b.write(h.type, 156, 1, 'ascii');
  b.write(h.linkname, 157, 100, 'utf8');
  b.write('ustar\u000000', 257, 8, 'ascii');
  b.fill(0x20, 148, 156);
  let sum = 0;
  for (const byte of b) sum += byte;
  b.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'ascii');
  return b;
}

/** The padding after a file's `size` bytes of data. */
export const dataPadding = (size: number): Buffer => Buffer.alloc((BLOCK - (size % BLOCK)) % BLOCK);

/** One pax record, "<length> <key>=<value>\n", its length counting itself. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  const bytes = Buffer.byteLength(body);
  let len = bytes + 1;
  while (String(len).length + bytes !== len) len = String(len).length + bytes;
  return `${len}${body}`;
}

/** The header blocks of one entry (a pax header first when its name, link or ids need one). */
export function tarHeader(h: Omit<TarHeader, 'type'> & { type: Exclude<TarType, 'other'> }): Buffer {
  const linkname = h.linkname ?? '';
  const records = [
    ...(Buffer.byteLength(h.name) > 100 ? [paxRecord('path', h.name)] : []),
    ...(Buffer.byteLength(linkname) > 100 ? [paxRecord('linkpath', linkname)] : []),
    ...(h.uid > MAX_ID ? [paxRecord('uid', String(h.uid))] : []),
    ...(h.gid > MAX_ID ? [paxRecord('gid', String(h.gid))] : []),
  ];
  const entry = ustar({ ...h, type: TYPE_FLAG[h.type], name: cut(h.name), linkname: cut(linkname), size: h.type === 'file' ? h.size : 0 });
  if (records.length === 0) return entry;
  const body = Buffer.from(records.join(''), 'utf8');
  const pax = ustar({ name: 'PaxHeader', type: 'x', mode: 0o644, uid: 0, gid: 0, mtime: h.mtime, size: body.length, linkname: '' });
  return Buffer.concat([pax, body, dataPadding(body.length), entry]);
}

/** A name cut to the 100 bytes of its ustar field (the pax record holds it whole). */
function cut(name: string): string {
  const b = Buffer.from(name, 'utf8');
  return b.length <= 100 ? name : b.subarray(0, 100).toString('utf8');
}

const field = (b: Buffer, at: number, len: number): string => {
  const raw = b.subarray(at, at + len);
  const nul = raw.indexOf(0);
  return (nul === -1 ? raw : raw.subarray(0, nul)).toString('utf8');
};

function number(b: Buffer, at: number, len: number, what: string): number {
  // Base-256 (the high bit of the first byte): what tar-stream and GNU tar write past the octal range.
  if ((b[at]! & 0x80) !== 0) {
    let n = 0;
    for (let i = at + 1; i < at + len; i++) n = n * 256 + b[i]!;
    return n;
  }
  const text = field(b, at, len).trim();
  if (text === '') return 0;
  if (!/^[0-7]+$/.test(text)) throw new Error(`tar header: ${what} is not an octal number (${JSON.stringify(text)})`);
  return parseInt(text, 8);
}

function parsePax(body: Buffer): Map<string, string> {
  const out = new Map<string, string>();
  let at = 0;
  while (at < body.length) {
    const space = body.indexOf(0x20, at);
    if (space === -1) break;
    const len = Number(body.subarray(at, space).toString('ascii'));
    if (!Number.isInteger(len) || len <= 0 || at + len > body.length) throw new Error('tar pax header: a malformed record');
    const record = body.subarray(space + 1, at + len - 1).toString('utf8');
    const eq = record.indexOf('=');
    if (eq > 0) out.set(record.slice(0, eq), record.slice(eq + 1));
    at += len;
  }
  return out;
}

/** Every entry of a whole tar in memory, with its data; pax and GNU long names applied. */
export function readTar(buf: Buffer): Array<{ header: TarHeader; data: Buffer }> {
  const out: Array<{ header: TarHeader; data: Buffer }> = [];
  let at = 0;
  let pax = new Map<string, string>();
  let longName: string | undefined;
  let longLink: string | undefined;
  while (at + BLOCK <= buf.length) {
    const b = buf.subarray(at, at + BLOCK);
    if (b.every((byte) => byte === 0)) break;
    const stored = number(b, 148, 8, 'checksum');
    let sum = 0;
    for (let i = 0; i < BLOCK; i++) sum += i >= 148 && i < 156 ? 0x20 : b[i]!;
    if (sum !== stored) throw new Error(`tar header at byte ${at}: bad checksum`);
    const size = number(b, 124, 12, 'size');
    const flag = String.fromCharCode(b[156]!);
    const dataAt = at + BLOCK;
    if (dataAt + size > buf.length) throw new Error(`tar entry at byte ${at}: its ${size} bytes run past the archive`);
    const data = buf.subarray(dataAt, dataAt + size);
    at = dataAt + size + ((BLOCK - (size % BLOCK)) % BLOCK);
    if (flag === 'x') {
      pax = parsePax(data);
      continue;
    }
    if (flag === 'g') continue;
    if (flag === 'L' || flag === 'K') {
      const text = field(data, 0, data.length);
      if (flag === 'L') longName = text;
      else longLink = text;
      continue;
    }
    const prefix = field(b, 257, 6) === 'ustar' ? field(b, 345, 155) : '';
    const short = field(b, 0, 100);
    const name = pax.get('path') ?? longName ?? (prefix !== '' ? `${prefix}/${short}` : short);
    const linkname = pax.get('linkpath') ?? longLink ?? field(b, 157, 100);
    const type: TarType = flag === '0' || flag === '\0' || flag === '7' ? 'file' : flag === '5' ? 'directory' : flag === '2' ? 'symlink' : flag === '1' ? 'link' : 'other';
    out.push({
      header: {
        name, type, mode: number(b, 100, 8, 'mode'), uid: number(b, 108, 8, 'uid'), gid: number(b, 116, 8, 'gid'),
        mtime: pax.has('mtime') ? Number(pax.get('mtime')) : number(b, 136, 12, 'mtime'), size,
        ...(linkname !== '' && { linkname }),
      },
      data,
    });
    pax = new Map();
    longName = undefined;
    longLink = undefined;
  }
  return out;
}
