/**
 * The headers an `http_call` audit record carries (spec "audit.http_calls"; DECISIONS.md:
 * "Header values that carry credentials are redacted"): names lowercased, the value of every
 * credential-carrying header replaced by `[REDACTED]`, bounded in count and size.
 */

export const REDACTED = '[REDACTED]';
/** Longest value kept, in UTF-16 code units (a longer one is cut). */
export const MAX_HEADER_VALUE = 1_024;
/** Most headers kept (the first ones, in the order given). */
export const MAX_HEADERS = 100;

/** Header names whose value is a credential, exactly. */
const CREDENTIAL_HEADERS = new Set(['authorization', 'proxy-authorization', 'cookie', 'set-cookie', 'x-api-key', 'api-key', 'x-auth-token']);
/** A header whose name contains one of these is taken for a credential too. */
const CREDENTIAL_WORDS = ['token', 'secret', 'password', 'apikey', 'api-key', 'api_key', 'session', 'credential'];

/** Whether the value of the header `name` (any case) is redacted. */
export function isCredentialHeader(name: string): boolean {
  const lower = name.toLowerCase();
  return CREDENTIAL_HEADERS.has(lower) || CREDENTIAL_WORDS.some((word) => lower.includes(word));
}

/**
 * Lowercased names; credential values redacted; an array (and names differing only in case)
 * joined with ", "; each value cut at MAX_HEADER_VALUE; at most MAX_HEADERS names; undefined
 * values left out.
 */
export function redactHeaders(headers: Record<string, string | string[] | undefined>): Record<string, string> {
  const joined = new Map<string, string[]>();
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    const lower = name.toLowerCase();
    let values = joined.get(lower);
    if (!values) {
      if (joined.size >= MAX_HEADERS) continue;
      values = [];
      joined.set(lower, values);
    }
    if (Array.isArray(value)) values.push(...value.map(String));
    else values.push(String(value));
  }
  // fromEntries defines own properties: a header named __proto__ stays a header.
  return Object.fromEntries([...joined].map(([name, values]) => [name, isCredentialHeader(name) ? REDACTED : cut(values.join(', '))]));
}

/** `value` cut at MAX_HEADER_VALUE, never inside a surrogate pair. */
function cut(value: string): string {
  if (value.length <= MAX_HEADER_VALUE) return value;
  const end = /[\uD800-\uDBFF]/.test(value[MAX_HEADER_VALUE - 1]) ? MAX_HEADER_VALUE - 1 : MAX_HEADER_VALUE;
  return value.slice(0, end);
}
