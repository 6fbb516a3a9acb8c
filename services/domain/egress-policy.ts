/**
 * The sandbox's egress policy in the product's words (docs/spec-format.md "Network"): the
 * grammar of a `network.egress.allow` entry, which entries are too broad, and the decision for
 * one destination. Pure: the proxy, the resolver and the packet filter ask it, the spec parser
 * validates with it, the scorer matches `http_except` with the same matching.
 *
 * An entry is a hostname (`api.example.com`), a glob whose whole first label is `*`
 * (`*.example.com`: every subdomain at any depth, not example.com itself), `*` alone (every host;
 * only under `default: allow`) or an IPv4 address (`10.0.0.7`), optionally followed by ports:
 * `:443`, `:443,8443`, `:8000-8100` (the agent snapshot's `auth.egress` hosts arrive as
 * `host:443,8443`). Names are compared lowercased without a trailing dot. An IP literal
 * destination matches only the identical IPv4 entry, never a name or a glob.
 */
import { isIP, isIPv4 } from 'node:net';
import { parse as parseDomain } from 'tldts';

export type EgressDefault = 'allow' | 'deny';

/** An entry parsed: `pattern` is the host part normalised; `ports` null means every port. */
export interface EgressRule {
  pattern: string;
  ports: number[] | null;
}

export interface EgressDecision {
  allowed: boolean;
  /** The allow entry (as written) that allowed it; null when the default decided or it was denied. */
  rule: string | null;
  /** One sentence for the audit record and the HTTP 403 body. */
  reason: string;
}

const MAX_NAME = 253;
const MAX_LABEL = 63;
const ENTRY_LIKE = 'a hostname, a *.example.com glob or an IPv4 address';

/** `Api.Example.COM.` -> `api.example.com`; `[::1]` -> `::1`. */
export function normaliseHost(host: string): string {
  let h = host.toLowerCase();
  if (h.startsWith('[') && h.endsWith(']')) h = h.slice(1, -1);
  return h.endsWith('.') && h.length > 1 ? h.slice(0, -1) : h;
}

const quote = (s: string) => JSON.stringify(s.length > MAX_NAME + 20 ? `${s.slice(0, MAX_NAME)}…` : s);

/**
 * Why `name` (already normalised) is not a hostname, or null. Strict, as the spec's names are:
 * labels of letters, digits and inner `-`, the last one not all digits (that would be an address).
 */
export function hostnameProblem(name: string): string | null {
  if (name === '') return 'is empty';
  if (name.length > MAX_NAME) return `is longer than ${MAX_NAME} characters`;
  const bad = /[^a-z0-9.-]/i.exec(name);
  if (bad) return `has ${quote(bad[0])}, which a hostname cannot have (letters, digits, "-" and ".")`;
  const labels = name.split('.');
  if (labels.some((l) => l === '')) return 'has an empty label';
  if (labels.some((l) => l.length > MAX_LABEL)) return `has a label longer than ${MAX_LABEL} characters`;
  if (labels.some((l) => l.startsWith('-') || l.endsWith('-'))) return 'has a label that starts or ends with "-"';
  if (/^\d+$/.test(labels[labels.length - 1]))
    return labels.every((l) => /^\d+$/.test(l)) ? 'is not a valid IPv4 address' : 'ends with a number, so it is not a hostname';
  return null;
}

/** A host part of an entry: `*`, `*.suffix`, a hostname or an IPv4 address; the problem otherwise. */
function hostPattern(raw: string, entry: string): string | { problem: string } {
  if (raw.startsWith('[') || raw.includes(':')) return { problem: `${quote(entry)} is an IPv6 address; an entry is ${ENTRY_LIKE}` };
  const host = normaliseHost(raw);
  if (host === '*') return host;
  if (isIPv4(host)) return host;
  const glob = host.startsWith('*.');
  const name = glob ? host.slice(2) : host;
  if (name.includes('*')) return { problem: `${quote(entry)} has * inside; * may only be the whole first label (*.example.com), or the whole entry` };
  const problem = hostnameProblem(name);
  if (problem) return { problem: `${quote(entry)} ${glob ? 'is not a glob: after "*." it ' : ''}${problem}; an entry is ${ENTRY_LIKE}` };
  return host;
}

/** `443,8443` or `8000-8100`, sorted, each once; the problem otherwise. */
function portList(text: string, entry: string): number[] | { problem: string } {
  if (text === '') return { problem: `${quote(entry)} has ":" and no port after it` };
  const ports = new Set<number>();
  for (const item of text.split(',')) {
    const m = /^(\d{1,5})(?:-(\d{1,5}))?$/.exec(item);
    if (!m) return { problem: `${quote(entry)} has the port ${quote(item)}; a port is a number from 1 to 65535 (a range: 8000-8100)` };
    const low = Number(m[1]);
    const high = m[2] === undefined ? low : Number(m[2]);
    for (const p of [low, high]) if (p < 1 || p > 65535) return { problem: `${quote(entry)} has the port ${p}, out of range 1-65535` };
    if (high < low) return { problem: `${quote(entry)} has the range ${item}, whose end is below its start` };
    for (let p = low; p <= high; p++) ports.add(p);
  }
  return [...ports].sort((a, b) => a - b);
}

/** Parses an entry of `network.egress.allow` (or an agent's `host:ports`); a string is the problem, naming the entry. */
export function parseEgressEntry(entry: string): EgressRule | string {
  if (entry === '') return `"" is empty; an entry is ${ENTRY_LIKE}`;
  const colon = entry.indexOf(':');
  // Two colons or a bracket: an IPv6 address (with or without a port), refused by hostPattern.
  const split = colon >= 0 && !entry.startsWith('[') && entry.indexOf(':', colon + 1) < 0;
  const pattern = hostPattern(split ? entry.slice(0, colon) : entry, entry);
  if (typeof pattern !== 'string') return pattern.problem;
  if (!split) return { pattern, ports: null };
  const ports = portList(entry.slice(colon + 1), entry);
  return Array.isArray(ports) ? { pattern, ports } : ports.problem;
}

/**
 * Why a pattern (an entry's host part, or a whole entry) is so broad that it opens egress to the
 * whole internet or a whole public suffix (`*`, `*.com`, `*.co.uk`, by the ICANN section of the
 * Public Suffix List through tldts), or null. Used as is where breadth is never acceptable (the
 * hosts a brokered secret is sent to).
 */
export function broadPatternProblem(pattern: string): string | null {
  const parsed = parseEgressEntry(pattern);
  const host = typeof parsed === 'string' ? normaliseHost(pattern) : parsed.pattern;
  if (host === '*') return `${quote(pattern)} matches every host`;
  if (!host.startsWith('*.')) return null;
  const suffix = host.slice(2);
  if (!suffix.includes('.')) return `${quote(pattern)} is too broad: a glob needs at least two labels after "*." (*.example.com)`;
  const { publicSuffix } = parseDomain(suffix, { extractHostname: false });
  if (publicSuffix === suffix) return `${quote(pattern)} is too broad: ${suffix} is a public suffix, so it matches every domain registered under it`;
  return null;
}

/**
 * Why an entry cannot be in `network.egress.allow` under this default, or null: its syntax
 * (parseEgressEntry), then its breadth, which only `default: allow` accepts (there the entry
 * changes nothing but the rule an audit record names).
 */
export function egressPatternProblem(pattern: string, defaultPolicy: EgressDefault): string | null {
  const parsed = parseEgressEntry(pattern);
  if (typeof parsed === 'string') return parsed;
  const broad = defaultPolicy === 'deny' ? broadPatternProblem(pattern) : null;
  return broad && `${broad}; under egress.default: deny, name the hosts (or set egress.default: allow)`;
}

/**
 * Whether a destination host matches a pattern (an EgressRule's, normalised): a name equal to
 * it, a subdomain at any depth of a `*.` glob, any name for `*`; an IP literal only the identical
 * IPv4 pattern. The same matching serves `forbidden.http_except`.
 */
export function patternMatchesHost(pattern: string, host: string): boolean {
  const h = normaliseHost(host);
  if (isIP(h) !== 0) return h === pattern;
  if (pattern === '*') return h !== '';
  if (pattern.startsWith('*.')) return h.length > pattern.length - 1 && h.endsWith(pattern.slice(1));
  return h === pattern;
}

/** A destination host as the proxy or resolver saw it: a name (lenient: `_` is let through) or an IP literal. */
function destinationProblem(host: string): string | null {
  if (isIP(host) !== 0) return null;
  if (host === '' || host.length > MAX_NAME || !/^[a-z0-9_-]{1,63}(?:\.[a-z0-9_-]{1,63})*$/.test(host)) return 'is not a hostname or an IP address';
  return null;
}

interface CompiledRule extends EgressRule {
  entry: string;
  portSet: ReadonlySet<number> | null;
}

/**
 * The policy of one sandbox: its default and its allow entries (the spec's, plus the agent
 * snapshot's hosts the caller joined). Entries that do not parse, or are too broad for the
 * default, are left out and listed in `rejected` (the spec's own entries were validated at
 * upload, so only joined ones can land there); the caller records them.
 */
export class EgressPolicy {
  readonly rules: ReadonlyArray<EgressRule & { entry: string }>;
  readonly rejected: ReadonlyArray<{ entry: string; problem: string }>;
  private readonly compiled: CompiledRule[] = [];

  constructor(
    readonly defaultPolicy: EgressDefault,
    allow: readonly string[],
  ) {
    const rejected: Array<{ entry: string; problem: string }> = [];
    for (const entry of allow) {
      const problem = egressPatternProblem(entry, defaultPolicy);
      if (problem !== null) {
        rejected.push({ entry, problem });
        continue;
      }
      const rule = parseEgressEntry(entry) as EgressRule;
      this.compiled.push({ ...rule, entry, portSet: rule.ports && new Set(rule.ports) });
    }
    this.rules = this.compiled.map(({ pattern, ports, entry }) => ({ pattern, ports, entry }));
    this.rejected = rejected;
  }

  /** Whether traffic to `host` (a name or an IP literal, v4 or v6) on `port` may leave, why, and by which entry. */
  decide(host: string, port: number): EgressDecision {
    const h = normaliseHost(host);
    const invalid = destinationProblem(h);
    const where = `${invalid ? quote(host) : isIP(h) === 6 ? `[${h}]` : h}:${port}`;
    if (invalid) return { allowed: false, rule: null, reason: `egress to ${where} is denied: ${quote(host)} ${invalid}` };
    if (!Number.isInteger(port) || port < 1 || port > 65535)
      return { allowed: false, rule: null, reason: `egress to ${where} is denied: ${port} is not a port from 1 to 65535` };
    const byName = this.compiled.filter((r) => patternMatchesHost(r.pattern, h));
    const match = byName.find((r) => r.portSet === null || r.portSet.has(port));
    if (match) return { allowed: true, rule: match.entry, reason: `egress to ${where} is allowed by the network.egress.allow entry ${quote(match.entry)}` };
    if (this.defaultPolicy === 'allow')
      return { allowed: true, rule: null, reason: `egress to ${where} is allowed: it matches no entry of network.egress.allow (default allow)` };
    if (byName.length > 0) {
      const [first] = byName;
      return {
        allowed: false,
        rule: null,
        reason: `egress to ${where} is denied: the network.egress.allow entry ${quote(first.entry)} allows only port${first.ports!.length > 1 ? 's' : ''} ${portsText(first.ports!)} (default deny)`,
      };
    }
    return { allowed: false, rule: null, reason: `egress to ${where} is denied: it matches no entry of network.egress.allow (default deny)` };
  }

  /** Whether some port of `host` is allowed: what the sandbox's resolver answers names for. */
  allowsHost(host: string): boolean {
    const h = normaliseHost(host);
    if (destinationProblem(h)) return false;
    return this.defaultPolicy === 'allow' || this.compiled.some((r) => patternMatchesHost(r.pattern, h));
  }
}

/** `[443, 8000, 8001, 8002]` -> `443, 8000-8002`. */
function portsText(ports: readonly number[]): string {
  const parts: string[] = [];
  for (let i = 0; i < ports.length; i++) {
    let j = i;
    while (j + 1 < ports.length && ports[j + 1] === ports[j] + 1) j++;
    parts.push(j > i ? `${ports[i]}-${ports[j]}` : String(ports[i]));
    i = j;
  }
  return parts.join(', ');
}
