/**
 * A passive observer of one PostgreSQL connection (frontend/backend protocol 3.0), fed by the
 * egress gateway with the bytes of both directions as it forwards them. It reports the writes
 * of transactions that ended in a rollback; committed writes are not its business (the
 * server's logical replication slot is the truth for those, see postgres.ts).
 *
 * What it follows: the startup packet (and an SSLRequest/GSSENCRequest answered 'N'; a
 * connection that goes encrypted is left alone), Query ('Q', several statements possible),
 * Parse/Bind/Execute/Sync/Close, and from the server CommandComplete, ErrorResponse,
 * EmptyQueryResponse, PortalSuspended and ReadyForQuery. A write's table comes from the
 * statement text (postgres-sql.ts: INSERT INTO x, UPDATE x, DELETE FROM x, COPY x FROM,
 * MERGE INTO x, TRUNCATE x, also behind WITH and through SQL PREPARE/EXECUTE), its row count
 * from the tag.
 *
 * When a transaction rolled back: a ROLLBACK (or a COMMIT answered ROLLBACK), an error in an
 * implicit transaction (the connection returns to idle after an ErrorResponse), ROLLBACK TO
 * SAVEPOINT (the writes since that savepoint). Approximations: a MERGE is reported as
 * 'update' (the wire does not say how its rows split); a TRUNCATE has row_count 0; the writes
 * of SELECT INTO / CREATE TABLE AS and of functions are not seen; the table is '' when the
 * statement's text was beyond what is kept. Zero-row writes are not reported.
 *
 * Cheap and bounded against a hostile client: only the bodies of the few message types above
 * are read, capped (the first 64 KiB of a query), in place when a message is whole in its
 * chunk; other bytes are only counted past. What is kept is capped: prepared statements and
 * portals (the oldest forgotten), savepoints and the writes of an open transaction (merged
 * per table and operation), responses awaited (past 16 Ki, or on bytes that are not the
 * protocol, the observer stops observing this connection). It never throws.
 */
import { analyzeStatement, Lexer, MAX_PREPARED, UNKNOWN, type StatementInfo } from './postgres-sql.ts';

export type WriteOperation = 'insert' | 'update' | 'delete' | 'truncate';

export interface ObservedWrite {
  /** schema-qualified unless in `public`, identifiers as the server names them (unquoted) */
  table: string;
  operation: WriteOperation;
  row_count: number;
}

/** How much of a message body is kept, by type; types not listed are skipped unread. */
const CLIENT_KEEP: Record<string, number> = { Q: 64 * 1024, P: 64 * 1024, B: 1024, E: 1024, C: 1024, S: 0, F: 0 };
const SERVER_KEEP: Record<string, number> = { C: 256, Z: 1, E: 0, I: 0, s: 0 };
const STARTUP_KEEP = 8;
const MAX_PENDING_WRITES = 4096;
const MAX_SAVEPOINTS = 1024;
const MAX_AWAITED = 16 * 1024;

const SSL_REQUEST = 80877103;
const GSSENC_REQUEST = 80877104;
const PROTOCOL_3 = 196608;

export class PgWireObserver {
  private readonly client = new Framer(CLIENT_KEEP, 'startup', (type, body) => this.onClientMessage(type, body));
  private readonly server = new Framer(SERVER_KEEP, 'typed', (type, body) => this.onServerMessage(type, body));
  private readonly statements = new StatementTracker();
  private readonly transaction: TransactionTracker;
  private inert = false;

  constructor(onRolledBack: (write: ObservedWrite) => void) {
    this.transaction = new TransactionTracker(onRolledBack);
  }

  fromClient(chunk: Buffer): void {
    this.feed(this.client, chunk);
  }

  fromServer(chunk: Buffer): void {
    this.feed(this.server, chunk);
  }

  /**
   * The connection ended: the server rolls back a transaction left open, so its writes are
   * reported; not when a request was still unanswered (a COMMIT may have been under way).
   */
  close(): void {
    if (this.inert) return;
    this.inert = true;
    try {
      if (this.statements.answered()) this.transaction.abandoned();
    } catch {
      // never throws
    }
  }

  private feed(framer: Framer, chunk: Buffer): void {
    if (this.inert) return;
    try {
      if (!framer.push(chunk)) this.inert = true;
    } catch {
      // A bug here must not break the connection it watches: stop watching it instead.
      this.inert = true;
    }
  }

  private onClientMessage(type: string, body: Buffer): void {
    if (type === '') return this.onStartup(body);
    const awaited = this.statements.onClientMessage(type, body);
    if (awaited === false) this.inert = true;
  }

  private onStartup(body: Buffer): void {
    const code = body.length >= 4 ? body.readInt32BE(0) : -1;
    if (code === SSL_REQUEST || code === GSSENC_REQUEST) {
      this.server.expectAnswerByte();
    } else if (code >>> 16 === PROTOCOL_3 >>> 16) {
      this.client.startTyped();
    } else {
      // CancelRequest or an unknown protocol: nothing to follow.
      this.inert = true;
    }
  }

  private onServerMessage(type: string, body: Buffer): void {
    switch (type) {
      case '!': // the answer to an SSLRequest/GSSENCRequest
        if (body[0] !== 0x4e) this.inert = true; // 'S'/'G': encrypted from here on
        return;
      case 'C': {
        const tag = body.toString('latin1', 0, body.indexOf(0) >= 0 ? body.indexOf(0) : body.length);
        this.transaction.onCommandComplete(tag, this.statements.completed(tag));
        return;
      }
      case 'I':
      case 's':
        this.statements.completed('');
        return;
      case 'E':
        this.statements.failed();
        this.transaction.onError();
        return;
      case 'Z':
        this.statements.ready();
        this.transaction.onReady(String.fromCharCode(body[0] ?? 0x49));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Framing: splits one direction into messages, keeping only the start of interesting bodies.

type FramerMode = 'startup' | 'typed';

class Framer {
  /** bytes to keep of each message type (by type byte); -1: skipped unread */
  private readonly keepByType = new Int32Array(256).fill(-1);
  /** a header split across chunks */
  private readonly header = Buffer.alloc(5);
  private headerLength = 0;
  /** answer bytes to an SSL/GSS request expected before the next typed message */
  private answerBytes = 0;
  /** what is left of the message under way (its body spans chunks) */
  private remaining = 0;
  private type = '';
  private kept: Buffer | null = null;
  private keptLength = 0;

  constructor(
    keep: Record<string, number>,
    private mode: FramerMode,
    private readonly onMessage: (type: string, body: Buffer) => void,
  ) {
    for (const [type, bytes] of Object.entries(keep)) this.keepByType[type.charCodeAt(0)] = bytes;
  }

  expectAnswerByte(): void {
    this.answerBytes++;
  }

  startTyped(): void {
    this.mode = 'typed';
  }

  /** false when the bytes are not the protocol */
  push(chunk: Buffer): boolean {
    let at = 0;
    while (at < chunk.length) {
      if (this.remaining > 0) {
        at = this.continueBody(chunk, at);
        continue;
      }
      if (this.answerBytes > 0 && this.headerLength === 0) {
        this.answerBytes--;
        this.onMessage('!', chunk.subarray(at, at + 1));
        at++;
        continue;
      }
      const typed = this.mode === 'typed';
      const headerSize = typed ? 5 : 4;
      let header = chunk;
      let headerAt = at;
      if (this.headerLength > 0 || chunk.length - at < headerSize) {
        const take = Math.min(headerSize - this.headerLength, chunk.length - at);
        chunk.copy(this.header, this.headerLength, at, at + take);
        this.headerLength += take;
        at += take;
        if (this.headerLength < headerSize) break;
        header = this.header;
        headerAt = 0;
        this.headerLength = 0;
      } else {
        at += headerSize;
      }
      const length = header.readInt32BE(headerAt + (typed ? 1 : 0));
      if (length < 4 || (!typed && length > 10_000)) return false;
      const type = typed ? header[headerAt]! : -1;
      const keep = typed ? this.keepByType[type]! : STARTUP_KEEP;
      const bodyLength = length - 4;
      const typeName = typed ? String.fromCharCode(type) : '';
      if (keep >= 0 && chunk.length - at >= bodyLength) {
        this.onMessage(typeName, chunk.subarray(at, at + Math.min(keep, bodyLength)));
        at += bodyLength;
      } else {
        this.type = typeName;
        this.remaining = bodyLength;
        this.kept = keep >= 0 ? Buffer.allocUnsafe(Math.min(keep, bodyLength)) : null;
        this.keptLength = 0;
      }
    }
    return true;
  }

  /** More of a body that spans chunks: kept (up to its cap) or skipped. */
  private continueBody(chunk: Buffer, at: number): number {
    const take = Math.min(this.remaining, chunk.length - at);
    if (this.kept && this.keptLength < this.kept.length) {
      this.keptLength += chunk.copy(this.kept, this.keptLength, at, at + Math.min(take, this.kept.length - this.keptLength));
    }
    this.remaining -= take;
    if (this.remaining === 0 && this.kept) {
      const body = this.kept;
      this.kept = null;
      this.onMessage(this.type, body.subarray(0, this.keptLength));
    }
    return at + take;
  }
}

// ---------------------------------------------------------------------------------------------
// Which statement each CommandComplete answers.

/** What the server will answer, in order: an Execute's statement, a Query's statements, a Sync. */
type Awaited = { kind: 'execute'; info: StatementInfo } | { kind: 'query'; infos: StatementInfo[]; next: number } | { kind: 'sync' };

class StatementTracker {
  private readonly prepared = new NamedInfos();
  private readonly portals = new NamedInfos();
  /** statements named by SQL PREPARE, for EXECUTE */
  private readonly sqlPrepared = new Map<string, StatementInfo>();
  private readonly awaited: Awaited[] = [];

  /** false when too many responses are awaited */
  onClientMessage(type: string, body: Buffer): boolean {
    switch (type) {
      case 'Q':
        this.awaited.push({ kind: 'query', infos: this.analyzeQuery(body), next: 0 });
        break;
      case 'P': {
        const name = cString(body, 0);
        const query = cString(body, name.end);
        this.prepared.set(name.text, analyzeStatement(new Lexer(query.text), this.sqlPrepared) ?? UNKNOWN);
        break;
      }
      case 'B': {
        const portal = cString(body, 0);
        const statement = cString(body, portal.end);
        this.portals.set(portal.text, this.prepared.get(statement.text));
        break;
      }
      case 'E':
        this.awaited.push({ kind: 'execute', info: this.portals.get(cString(body, 0).text) });
        break;
      case 'C': // Close: 'S' statement or 'P' portal
        (body[0] === 0x53 ? this.prepared : this.portals).delete(cString(body, 1).text);
        break;
      case 'S':
      case 'F': // a FunctionCall is answered like a Sync: with ReadyForQuery
        this.awaited.push({ kind: 'sync' });
    }
    return this.awaited.length <= MAX_AWAITED;
  }

  /** The statement a CommandComplete (`tag`; '' for an empty query or a suspended portal) answers. */
  completed(tag: string): StatementInfo {
    const front = this.awaited[0];
    if (!front || front.kind === 'sync') return UNKNOWN;
    if (front.kind === 'execute') {
      this.awaited.shift();
      return front.info;
    }
    const verb = tag.split(' ', 1)[0]!;
    for (let i = front.next; i < front.infos.length; i++) {
      if (answers(verb, front.infos[i]!)) {
        front.next = i + 1;
        return front.infos[i]!;
      }
    }
    return UNKNOWN;
  }

  /** Whether every request sent has been answered. */
  answered(): boolean {
    return this.awaited.length === 0;
  }

  /** ErrorResponse: the server skips the rest of the pipeline until the next Sync. */
  failed(): void {
    while (this.awaited[0]?.kind === 'execute') this.awaited.shift();
  }

  /** ReadyForQuery: the Query or Sync at the front is answered. */
  ready(): void {
    while (this.awaited.length) if (this.awaited.shift()!.kind !== 'execute') return;
  }

  private analyzeQuery(body: Buffer): StatementInfo[] {
    const end = body[body.length - 1] === 0 ? body.length - 1 : body.length;
    const lexer = new Lexer(body.toString('utf8', 0, end));
    // One statement (the usual case): only its first words are read, not the whole text.
    if (!severalStatements(body, end)) return [analyzeStatement(lexer, this.sqlPrepared) ?? UNKNOWN];
    const infos: StatementInfo[] = [];
    while (!lexer.done()) {
      const info = analyzeStatement(lexer, this.sqlPrepared);
      if (info) infos.push(info);
      lexer.skipStatement();
    }
    return infos;
  }
}

/** Whether a ';' is followed by more than whitespace and ';' (a ';' in a literal also says yes: then the text is lexed in full). */
function severalStatements(body: Buffer, end: number): boolean {
  const semicolon = body.indexOf(0x3b);
  if (semicolon < 0 || semicolon >= end) return false;
  for (let i = semicolon + 1; i < end; i++) {
    const c = body[i]!;
    if (c > 32 && c !== 0x3b) return true;
  }
  return false;
}

/** Prepared statements or portals by name: the unnamed one (most used) apart, the oldest named forgotten past the cap. */
class NamedInfos {
  private unnamed: StatementInfo = UNKNOWN;
  private readonly named = new Map<string, StatementInfo>();

  get(name: string): StatementInfo {
    return name === '' ? this.unnamed : (this.named.get(name) ?? UNKNOWN);
  }

  set(name: string, info: StatementInfo): void {
    if (name === '') {
      this.unnamed = info;
      return;
    }
    this.named.delete(name);
    this.named.set(name, info);
    if (this.named.size > MAX_PREPARED) this.named.delete(this.named.keys().next().value!);
  }

  delete(name: string): void {
    if (name === '') this.unnamed = UNKNOWN;
    else this.named.delete(name);
  }
}

function cString(body: Buffer, start: number): { text: string; end: number } {
  const nul = body.indexOf(0, start);
  const end = nul >= 0 ? nul : body.length;
  return { text: body.toString('utf8', start, end), end: end + 1 };
}

/** Whether a CommandComplete whose tag starts with `verb` can answer `info`. */
function answers(verb: string, info: StatementInfo): boolean {
  switch (info.kind) {
    case 'write':
      return info.verb === verb;
    case 'copy-to':
      return verb === 'COPY';
    case 'truncate':
      return verb === 'TRUNCATE';
    case 'commit': // a COMMIT of a failed transaction is answered ROLLBACK
      return verb === 'COMMIT' || verb === 'ROLLBACK';
    case 'rollback':
    case 'rollback-to':
      return verb === 'ROLLBACK';
    case 'savepoint':
      return verb === 'SAVEPOINT';
    case 'release':
      return verb === 'RELEASE';
    default:
      return false;
  }
}

// ---------------------------------------------------------------------------------------------
// The writes of the open transaction, and what becomes of them.

interface PendingWrite extends ObservedWrite {
  key: string;
}

class TransactionTracker {
  private pending: PendingWrite[] = [];
  /** where each savepoint's writes start in `pending` */
  private readonly savepoints: Array<{ name: string; mark: number }> = [];
  /** an error since the transaction (or its last ROLLBACK TO) began: it cannot commit */
  private errored = false;

  constructor(private readonly onRolledBack: (write: ObservedWrite) => void) {}

  onCommandComplete(tag: string, info: StatementInfo): void {
    const verb = tag.split(' ', 1)[0]!;
    if (verb === 'COMMIT') return this.end(false);
    if (verb === 'ROLLBACK') return this.onRollback(info);
    if (verb === 'SAVEPOINT') {
      if (this.savepoints.length < MAX_SAVEPOINTS) this.savepoints.push({ name: info.kind === 'savepoint' ? info.name : '', mark: this.pending.length });
    } else if (verb === 'RELEASE') {
      const index = this.savepointIndex(info.kind === 'release' ? info.name : null);
      if (index >= 0) this.savepoints.length = index;
    } else if (verb === 'TRUNCATE' && info.kind === 'truncate') {
      for (const table of info.tables) this.add(table, 'truncate', 0);
    } else {
      this.onWrite(verb, tag, info);
    }
  }

  onError(): void {
    this.errored = true;
  }

  /** The connection ended in the middle of the transaction: the server rolls it back. */
  abandoned(): void {
    this.end(true);
  }

  onReady(status: string): void {
    // Back to idle: an implicit transaction ended, committed unless an error aborted it.
    if (status === 'I') this.end(this.errored);
  }

  private onWrite(verb: string, tag: string, info: StatementInfo): void {
    const operation = OPERATION_BY_VERB[verb];
    if (!operation) return;
    if (info.kind === 'copy-to') return;
    const rows = Number(tag.slice(tag.lastIndexOf(' ') + 1));
    if (!(rows > 0)) return;
    this.add(info.kind === 'write' ? info.table : '', operation, rows);
  }

  private onRollback(info: StatementInfo): void {
    if (info.kind !== 'rollback-to') return this.end(true);
    // The server knows the savepoint: one not found here was lost past a cap; the latest stands in.
    const named = this.savepointIndex(info.name);
    const index = named >= 0 ? named : this.savepointIndex(null);
    if (index < 0) return;
    const mark = this.savepoints[index]!.mark;
    this.savepoints.length = index + 1;
    this.report(this.pending.splice(mark));
    this.errored = false;
  }

  private add(table: string, operation: WriteOperation, rows: number): void {
    const key = `${operation}\0${table}`;
    // Coalesce within the current savepoint's writes, so a long transaction keeps few entries.
    const from = this.savepoints.at(-1)?.mark ?? 0;
    for (let i = this.pending.length - 1; i >= from; i--) {
      if (this.pending[i]!.key === key) {
        this.pending[i]!.row_count += rows;
        return;
      }
    }
    if (this.pending.length < MAX_PENDING_WRITES) this.pending.push({ key, table, operation, row_count: rows });
  }

  /** The innermost savepoint of that name (the latest when the name is unknown), or -1. */
  private savepointIndex(name: string | null): number {
    if (name === null) return this.savepoints.length - 1;
    for (let i = this.savepoints.length - 1; i >= 0; i--) if (this.savepoints[i]!.name === name) return i;
    return -1;
  }

  private end(rolledBack: boolean): void {
    if (rolledBack) this.report(this.pending);
    this.pending = [];
    this.savepoints.length = 0;
    this.errored = false;
  }

  private report(writes: PendingWrite[]): void {
    for (const { table, operation, row_count } of writes) this.onRolledBack({ table, operation, row_count });
  }
}

const OPERATION_BY_VERB: Record<string, WriteOperation> = { INSERT: 'insert', UPDATE: 'update', DELETE: 'delete', COPY: 'insert', MERGE: 'update' };
