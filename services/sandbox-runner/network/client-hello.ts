/**
 * Reads the server name (SNI, RFC 6066 §3) and the offered ALPN protocols (RFC 7301) from the
 * first bytes a client sends, without consuming them: the egress proxy peeks at a connection's
 * start to learn where a TLS client is going before it decides and relays (or intercepts).
 *
 * The first handshake message must be a ClientHello (RFC 8446 §4.1.2, same layout in TLS 1.0 to
 * 1.2), carried in one or more handshake records (RFC 8446 §5.1: a handshake message may span
 * records). Only that message is read; whatever follows it is ignored. A hello over 16 KiB, a
 * structure whose lengths do not add up, a duplicate extension, or a server name that is not
 * printable ASCII is 'not-tls' (a server would refuse it too). Never throws.
 */

export type ClientHello = { state: 'incomplete' } | { state: 'not-tls' } | { state: 'tls'; serverName: string | null; alpn: string[] };

/** The largest ClientHello accepted (the body, without its 4-byte handshake header). */
export const MAX_CLIENT_HELLO = 16 * 1024;

const RECORD_HANDSHAKE = 22;
const HANDSHAKE_CLIENT_HELLO = 1;
const RECORD_HEADER = 5;
const HANDSHAKE_HEADER = 4;
/** RFC 8446 §5.1: a plaintext record holds at most 2^14 bytes. */
const MAX_RECORD = 16_384;
const EXT_SERVER_NAME = 0;
const EXT_ALPN = 16;
const NAME_TYPE_HOST = 0;

const INCOMPLETE = { state: 'incomplete' } as const;
const NOT_TLS = { state: 'not-tls' } as const;

export function readClientHello(buf: Buffer): ClientHello {
  try {
    const body = handshakeMessage(buf);
    if (!Buffer.isBuffer(body)) return body;
    return parseClientHello(body) ?? NOT_TLS;
  } catch {
    return NOT_TLS; // not expected: every read below is bounds-checked
  }
}

/**
 * The body of the first handshake message, gathered from the records at the start of `buf`;
 * or 'incomplete' while more bytes could still make one; or 'not-tls' once they cannot.
 */
function handshakeMessage(buf: Buffer): Buffer | typeof INCOMPLETE | typeof NOT_TLS {
  const fragments: Buffer[] = [];
  let gathered = 0;
  let needed = -1; // header + body length, once the 4-byte handshake header is in
  for (let offset = 0; ; ) {
    if (buf.length - offset < RECORD_HEADER) return partialRecordHeader(buf.subarray(offset));
    const type = buf[offset];
    const major = buf[offset + 1];
    const minor = buf[offset + 2];
    const length = buf.readUInt16BE(offset + 3);
    if (type !== RECORD_HANDSHAKE || major !== 3 || minor > 4 || length === 0 || length > MAX_RECORD) return NOT_TLS;
    const start = offset + RECORD_HEADER;
    const end = Math.min(start + length, buf.length);
    fragments.push(buf.subarray(start, end));
    gathered += end - start;
    if (fragments[0].length > 0 && fragments[0][0] !== HANDSHAKE_CLIENT_HELLO) return NOT_TLS;
    if (needed < 0 && gathered >= HANDSHAKE_HEADER) {
      const header = fragments.length === 1 ? fragments[0] : Buffer.concat(fragments);
      const bodyLength = header.readUIntBE(1, 3);
      if (bodyLength > MAX_CLIENT_HELLO) return NOT_TLS;
      needed = HANDSHAKE_HEADER + bodyLength;
    }
    if (needed >= 0 && gathered >= needed) return Buffer.concat(fragments).subarray(HANDSHAKE_HEADER, needed);
    if (end < start + length) return INCOMPLETE;
    offset = start + length;
  }
}

/** Fewer than 5 bytes of a record header: 'not-tls' as soon as a byte rules TLS out. */
function partialRecordHeader(head: Buffer): typeof INCOMPLETE | typeof NOT_TLS {
  if (head.length >= 1 && head[0] !== RECORD_HANDSHAKE) return NOT_TLS;
  if (head.length >= 2 && head[1] !== 3) return NOT_TLS;
  if (head.length >= 3 && head[2] > 4) return NOT_TLS;
  return INCOMPLETE;
}

/** A bounds-checked cursor over a buffer: every read returns null past the end. */
class Reader {
  #offset = 0;
  constructor(private readonly buf: Buffer) {}

  get remaining(): number {
    return this.buf.length - this.#offset;
  }

  u8(): number | null {
    if (this.remaining < 1) return null;
    return this.buf[this.#offset++];
  }

  u16(): number | null {
    if (this.remaining < 2) return null;
    const value = this.buf.readUInt16BE(this.#offset);
    this.#offset += 2;
    return value;
  }

  bytes(length: number): Buffer | null {
    if (length < 0 || this.remaining < length) return null;
    const out = this.buf.subarray(this.#offset, this.#offset + length);
    this.#offset += length;
    return out;
  }

  /** A vector with a 1- or 2-byte length prefix, its length within [min, max]. */
  vector(prefix: 1 | 2, min: number, max: number): Buffer | null {
    const length = prefix === 1 ? this.u8() : this.u16();
    if (length === null || length < min || length > max) return null;
    return this.bytes(length);
  }
}

/**
 *   struct {
 *     ProtocolVersion legacy_version;                        2 bytes, 3.x
 *     Random random;                                         32 bytes
 *     opaque legacy_session_id<0..32>;
 *     CipherSuite cipher_suites<2..2^16-2>;                  pairs of bytes
 *     opaque legacy_compression_methods<1..2^8-1>;
 *     Extension extensions<8..2^16-1>;                       absent in some TLS 1.0-1.2 hellos
 *   } ClientHello;
 *   struct { ExtensionType extension_type; opaque extension_data<0..2^16-1>; } Extension;
 */
function parseClientHello(body: Buffer): ClientHello | null {
  const r = new Reader(body);
  if (r.u8() !== 3 || r.u8() === null) return null;
  if (r.bytes(32) === null) return null;
  if (r.vector(1, 0, 32) === null) return null;
  const suites = r.vector(2, 2, 0xfffe);
  if (suites === null || suites.length % 2 !== 0) return null;
  if (r.vector(1, 1, 0xff) === null) return null;
  const hello = { state: 'tls' as const, serverName: null as string | null, alpn: [] as string[] };
  if (r.remaining === 0) return hello;
  const extensions = r.vector(2, 0, 0xffff);
  if (extensions === null || r.remaining !== 0) return null;
  const seen = new Set<number>();
  for (const e = new Reader(extensions); e.remaining > 0; ) {
    const type = e.u16();
    const data = e.vector(2, 0, 0xffff);
    if (type === null || data === null || seen.has(type)) return null;
    seen.add(type);
    if (type === EXT_SERVER_NAME) {
      const name = parseServerName(data);
      if (name === false) return null;
      hello.serverName = name;
    } else if (type === EXT_ALPN) {
      const alpn = parseAlpn(data);
      if (alpn === null) return null;
      hello.alpn = alpn;
    }
  }
  return hello;
}

/**
 *   struct { NameType name_type; select (name_type) { case host_name: HostName; } name; } ServerName;
 *   opaque HostName<1..2^16-1>;
 *   struct { ServerName server_name_list<1..2^16-1> } ServerNameList;
 *
 * The host_name entry (null without one), which must be printable ASCII and appear once; false
 * when malformed. Other name types (none are defined) are read as the same opaque vector and
 * skipped.
 */
function parseServerName(data: Buffer): string | null | false {
  const outer = new Reader(data);
  const list = outer.vector(2, 1, 0xffff);
  if (list === null || outer.remaining !== 0) return false;
  let host: string | null = null;
  for (const r = new Reader(list); r.remaining > 0; ) {
    const type = r.u8();
    const name = r.vector(2, 1, 0xffff);
    if (type === null || name === null) return false;
    if (type !== NAME_TYPE_HOST) continue;
    if (host !== null) return false;
    for (const byte of name) if (byte < 0x21 || byte > 0x7e) return false;
    host = name.toString('latin1');
  }
  return host;
}

/**
 *   opaque ProtocolName<1..2^8-1>;
 *   struct { ProtocolName protocol_name_list<2..2^16-1> } ProtocolNameList;
 */
function parseAlpn(data: Buffer): string[] | null {
  const outer = new Reader(data);
  const list = outer.vector(2, 2, 0xffff);
  if (list === null || outer.remaining !== 0) return null;
  const protocols: string[] = [];
  for (const r = new Reader(list); r.remaining > 0; ) {
    const name = r.vector(1, 1, 0xff);
    if (name === null) return null;
    protocols.push(name.toString('latin1'));
  }
  return protocols;
}
