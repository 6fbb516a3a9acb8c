/**
 * How deep a JSON body may nest objects and arrays (docs/api.md). Checked on the text, before
 * the body is parsed or anything recursive (validation, JSON.stringify, redaction) walks it: a
 * 50,000-deep `metadata` overflowed the stack of trace validation.
 */
import { badRequest } from '../kernel/errors.ts';

export const MAX_JSON_DEPTH = 100;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COMMA = 0x2c;
const OPEN_OBJECT = 0x7b;
const OPEN_ARRAY = 0x5b;
const CLOSE_OBJECT = 0x7d;
const CLOSE_ARRAY = 0x5d;

/**
 * A 400 naming where `text` nests deeper than MAX_JSON_DEPTH, e.g. `events[0].metadata.a.a…`.
 * `field` names the text's top-level value when it has a name (a form field); without it, a
 * body's keys are field names and a top-level array is `body`. Malformed text is left to the
 * parser, which reports it.
 */
export function checkJsonDepth(text: string, field?: string): void {
  if (!nestsTooDeep(text)) return;
  // Per open container: its key or index so far (null: an object's key not read yet).
  const path: Array<string | number | null> = [];
  let keyExpected = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      const start = i;
      i = stringEnd(text, i);
      if (keyExpected) {
        path[path.length - 1] = keyOf(text.slice(start, i + 1));
        keyExpected = false;
      }
    } else if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      if (path.length === MAX_JSON_DEPTH) throw badRequest(render(path, field), `nests objects and arrays deeper than ${MAX_JSON_DEPTH} levels`);
      path.push(c === OPEN_ARRAY ? 0 : null);
      keyExpected = c === OPEN_OBJECT;
    } else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) {
      path.pop();
      keyExpected = false;
    } else if (c === COMMA && path.length > 0) {
      const top = path[path.length - 1];
      if (typeof top === 'number') path[path.length - 1] = top + 1;
      else keyExpected = true;
    }
  }
}

/** Depth alone, without the path: the common case (a body within the limit) costs one quick pass. */
function nestsTooDeep(text: string): boolean {
  let depth = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) i = stringEnd(text, i);
    else if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      if (++depth > MAX_JSON_DEPTH) return true;
    } else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) depth--;
  }
  return false;
}

/** The index of the quote that closes the string opened at `start` (indexOf: long strings are most of a big body). */
function stringEnd(text: string, start: number): number {
  for (let j = start; ; ) {
    j = text.indexOf('"', j + 1);
    if (j === -1) return text.length;
    let k = j - 1;
    while (text.charCodeAt(k) === BACKSLASH) k--;
    if ((j - 1 - k) % 2 === 0) return j;
  }
}

function keyOf(quoted: string): string {
  try {
    return JSON.parse(quoted) as string;
  } catch {
    return quoted;
  }
}

/** The first levels of the path, then `…`: enough to find the field. */
function render(path: Array<string | number | null>, field: string | undefined): string {
  const shown = path.slice(0, 10);
  let out = field ?? (typeof shown[0] === 'number' || shown.length === 0 ? 'body' : '');
  for (const part of shown) out += typeof part === 'number' ? `[${part}]` : out === '' ? String(part) : `.${part}`;
  return path.length > shown.length ? `${out}…` : out;
}
