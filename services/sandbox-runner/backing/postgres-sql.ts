/**
 * SQL, just enough of it for the wire observer (postgres-wire.ts): tokens, and what a statement
 * writes (its verb and table), or whether it commits, rolls back, or sets, releases or returns to
 * a savepoint. A statement is read token by token only as far as that needs; what cannot be
 * told is `UNKNOWN`, never an error.
 */

/** Prepared statements (SQL PREPARE here, the protocol's in postgres-wire.ts) kept by name, at the most. */
export const MAX_PREPARED = 1024;

/** What a statement is, as far as rollbacks go. */
export type StatementInfo =
  | { kind: 'write'; verb: 'INSERT' | 'UPDATE' | 'DELETE' | 'MERGE' | 'COPY'; table: string }
  | { kind: 'truncate'; tables: string[] }
  | { kind: 'copy-to' | 'commit' | 'rollback' }
  | { kind: 'savepoint' | 'release' | 'rollback-to'; name: string }
  | { kind: 'other' };

export const UNKNOWN: StatementInfo = { kind: 'other' };

type Token = { kind: 'word'; text: string } | { kind: 'ident'; text: string } | { kind: 'punct'; text: string } | { kind: 'other' };

/** Tokens of SQL text: words lower-cased, quoted identifiers unquoted, strings, comments and dollar quotes skipped. */
export class Lexer {
  private at = 0;
  private peeked: Token | null = null;

  constructor(private readonly text: string) {}

  done(): boolean {
    return this.peek() === null;
  }

  peek(): Token | null {
    this.peeked ??= this.read();
    return this.peeked;
  }

  next(): Token | null {
    const token = this.peek();
    this.peeked = null;
    return token;
  }

  /** Skips to just past the next top-level ';' (or the end). */
  skipStatement(): void {
    for (let token = this.next(); token; token = this.next()) if (token.kind === 'punct' && token.text === ';') return;
  }

  private read(): Token | null {
    const text = this.text;
    for (;;) {
      const c = text.charCodeAt(this.at);
      if (Number.isNaN(c)) return null;
      if (c <= 32) {
        this.at++;
      } else if (c === 45 && text.charCodeAt(this.at + 1) === 45) {
        const eol = text.indexOf('\n', this.at);
        this.at = eol < 0 ? text.length : eol + 1;
      } else if (c === 47 && text.charCodeAt(this.at + 1) === 42) {
        this.skipBlockComment();
      } else if (c === 39) {
        this.skipString(false);
        return { kind: 'other' };
      } else if (c === 34) {
        return { kind: 'ident', text: this.readQuoted() };
      } else if (c === 36 && this.skipDollarQuote()) {
        return { kind: 'other' };
      } else if (isWordStart(c)) {
        const start = this.at;
        while (this.at < text.length && isWordPart(text.charCodeAt(this.at))) this.at++;
        const word = text.slice(start, this.at);
        if (text.charCodeAt(this.at) === 39 && (word === 'e' || word === 'E')) {
          this.skipString(true);
          return { kind: 'other' };
        }
        return { kind: 'word', text: word.toLowerCase() };
      } else {
        this.at++;
        return c === 59 || c === 40 || c === 41 || c === 44 || c === 46 ? { kind: 'punct', text: String.fromCharCode(c) } : { kind: 'other' };
      }
    }
  }

  private skipBlockComment(): void {
    let depth = 0;
    const text = this.text;
    while (this.at < text.length) {
      if (text.startsWith('/*', this.at)) {
        depth++;
        this.at += 2;
      } else if (text.startsWith('*/', this.at)) {
        this.at += 2;
        if (--depth === 0) return;
      } else {
        this.at++;
      }
    }
  }

  private skipString(backslashEscapes: boolean): void {
    const text = this.text;
    this.at++;
    while (this.at < text.length) {
      const c = text.charCodeAt(this.at++);
      if (c === 92 && backslashEscapes) this.at++;
      else if (c === 39) {
        if (text.charCodeAt(this.at) !== 39) return;
        this.at++;
      }
    }
  }

  private readQuoted(): string {
    const text = this.text;
    let value = '';
    this.at++;
    while (this.at < text.length) {
      const close = text.indexOf('"', this.at);
      if (close < 0) break;
      value += text.slice(this.at, close);
      this.at = close + 1;
      if (text.charCodeAt(this.at) !== 34) return value;
      value += '"';
      this.at++;
    }
    this.at = text.length;
    return value;
  }

  /** `$tag$ ... $tag$`; false (nothing consumed) for a `$1` parameter. */
  private skipDollarQuote(): boolean {
    const match = /^\$([A-Za-z_\u0080-\uffff][A-Za-z0-9_\u0080-\uffff]*)?\$/.exec(this.text.slice(this.at, this.at + 66));
    if (!match) return false;
    const close = this.text.indexOf(match[0], this.at + match[0].length);
    this.at = close < 0 ? this.text.length : close + match[0].length;
    return true;
  }
}

const isWordStart = (c: number): boolean => (c >= 97 && c <= 122) || (c >= 65 && c <= 90) || c === 95 || c >= 128;
const isWordPart = (c: number): boolean => isWordStart(c) || (c >= 48 && c <= 57) || c === 36;

const WRITE_START: Record<string, { verb: 'INSERT' | 'UPDATE' | 'DELETE' | 'MERGE'; followedBy: string | null }> = {
  insert: { verb: 'INSERT', followedBy: 'into' },
  update: { verb: 'UPDATE', followedBy: null },
  delete: { verb: 'DELETE', followedBy: 'from' },
  merge: { verb: 'MERGE', followedBy: 'into' },
};

/** What the statement at the lexer writes; the lexer is left inside it (the caller skips the rest). */
export function analyzeStatement(lexer: Lexer, sqlPrepared: Map<string, StatementInfo>): StatementInfo | null {
  const first = lexer.peek();
  if (first?.kind === 'punct' && first.text === ';') return null;
  const word = first?.kind === 'word' ? first.text : '';
  lexer.next();
  switch (word) {
    case 'insert':
    case 'update':
    case 'delete':
    case 'merge':
      return writeTarget(lexer, WRITE_START[word]!);
    case 'with':
      return writeAfterWith(lexer);
    case 'copy':
      return copyTarget(lexer);
    case 'truncate':
      return truncateTargets(lexer);
    case 'commit':
    case 'end':
      return { kind: 'commit' };
    case 'rollback':
    case 'abort':
      return rollbackKind(lexer);
    case 'savepoint':
      return { kind: 'savepoint', name: nameOf(lexer.next()) };
    case 'release':
      if (isWord(lexer.peek(), 'savepoint')) lexer.next();
      return { kind: 'release', name: nameOf(lexer.next()) };
    case 'prepare':
      return prepareStatement(lexer, sqlPrepared);
    case 'execute':
      return sqlPrepared.get(nameOf(lexer.next())) ?? UNKNOWN;
    default:
      return UNKNOWN;
  }
}

function writeTarget(lexer: Lexer, start: { verb: 'INSERT' | 'UPDATE' | 'DELETE' | 'MERGE'; followedBy: string | null }): StatementInfo {
  if (start.followedBy && !isWord(lexer.next(), start.followedBy)) return UNKNOWN;
  if (isWord(lexer.peek(), 'only')) lexer.next();
  const table = qualifiedName(lexer);
  return table === null ? UNKNOWN : { kind: 'write', verb: start.verb, table };
}

/** `WITH ... <write>`: the write at parenthesis depth 0 after the common table expressions. */
function writeAfterWith(lexer: Lexer): StatementInfo {
  let depth = 0;
  for (let token = lexer.peek(); token; token = lexer.peek()) {
    if (token.kind === 'punct') {
      if (token.text === ';') return UNKNOWN;
      if (token.text === '(') depth++;
      if (token.text === ')') depth--;
    } else if (depth === 0 && token.kind === 'word' && WRITE_START[token.text]) {
      lexer.next();
      return writeTarget(lexer, WRITE_START[token.text]!);
    }
    lexer.next();
  }
  return UNKNOWN;
}

/** `COPY table [(columns)] FROM ...` writes; `COPY ... TO` and `COPY (query) TO` do not. */
function copyTarget(lexer: Lexer): StatementInfo {
  const table = qualifiedName(lexer);
  if (table === null) return { kind: 'copy-to' };
  if (lexer.peek()?.kind === 'punct' && (lexer.peek() as { text: string }).text === '(') {
    for (let token = lexer.next(); token && !(token.kind === 'punct' && token.text === ')'); token = lexer.next());
  }
  return isWord(lexer.next(), 'from') ? { kind: 'write', verb: 'COPY', table } : { kind: 'copy-to' };
}

function truncateTargets(lexer: Lexer): StatementInfo {
  if (isWord(lexer.peek(), 'table')) lexer.next();
  const tables: string[] = [];
  for (;;) {
    if (isWord(lexer.peek(), 'only')) lexer.next();
    const table = qualifiedName(lexer);
    if (table === null) break;
    tables.push(table);
    const token = lexer.peek();
    if (token?.kind === 'other') lexer.next(); // `name *`
    if (!(lexer.peek()?.kind === 'punct' && (lexer.peek() as { text: string }).text === ',')) break;
    lexer.next();
  }
  return { kind: 'truncate', tables };
}

/** ROLLBACK [WORK|TRANSACTION] [TO [SAVEPOINT] name] | [AND [NO] CHAIN] */
function rollbackKind(lexer: Lexer): StatementInfo {
  if (isWord(lexer.peek(), 'work') || isWord(lexer.peek(), 'transaction')) lexer.next();
  if (!isWord(lexer.peek(), 'to')) return { kind: 'rollback' };
  lexer.next();
  if (isWord(lexer.peek(), 'savepoint')) lexer.next();
  return { kind: 'rollback-to', name: nameOf(lexer.next()) };
}

/** `PREPARE name [(types)] AS statement`: remembered for EXECUTE. */
function prepareStatement(lexer: Lexer, sqlPrepared: Map<string, StatementInfo>): StatementInfo {
  const name = nameOf(lexer.next());
  for (let token = lexer.peek(); token && !isWord(token, 'as'); token = lexer.peek()) {
    if (token.kind === 'punct' && token.text === ';') return UNKNOWN;
    lexer.next();
  }
  lexer.next();
  const info = analyzeStatement(lexer, sqlPrepared) ?? UNKNOWN;
  if (sqlPrepared.size < MAX_PREPARED || sqlPrepared.has(name)) sqlPrepared.set(name, info);
  return UNKNOWN;
}

/** `name` or `schema.name` (`public.` dropped), or null when the next token is not a name. */
function qualifiedName(lexer: Lexer): string | null {
  const first = lexer.peek();
  if (first?.kind !== 'word' && first?.kind !== 'ident') return null;
  lexer.next();
  const dot = lexer.peek();
  if (!(dot?.kind === 'punct' && dot.text === '.')) return first.text;
  lexer.next();
  const second = lexer.peek();
  if (second?.kind !== 'word' && second?.kind !== 'ident') return first.text;
  lexer.next();
  return first.text === 'public' ? second.text : `${first.text}.${second.text}`;
}

const isWord = (token: Token | null, word: string): boolean => token?.kind === 'word' && token.text === word;
const nameOf = (token: Token | null): string => (token?.kind === 'word' || token?.kind === 'ident' ? token.text : '');
