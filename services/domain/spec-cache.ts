/**
 * Parsed spec documents by their text, one cache per process: every reader of a pinned spec (the
 * experiment catalog, eval history, the aggregator, the alerter) asks here (the spec catalog keeps
 * each stored version's document with the version instead), so a text in
 * use is parsed once (a 200-entry matrix takes milliseconds) and memory stays bounded.
 *
 * Keyed by the text itself, not by spec id and version: a pinned yaml outlives its stored version,
 * and a text always parses to the same document, or fails with the same error, which is kept too
 * (a reader that logs it logs it once). Bounded by the texts' total size, least recently used first
 * out, so many small specs stay while a few large ones cannot crowd out the rest.
 * Callers share the documents: they must not change them.
 *
 * The YAML trees a run's spec is made from (`domain/run-plan.ts` substitutes a matrix entry into
 * one before checking it) are kept here too, under a bound of their own of the same size.
 */
import { LRUCache } from 'lru-cache';
import { parse as parseYaml } from 'yaml';
import { parseSpec, type SpecDocument } from './spec.ts';

/** Characters of spec text whose outcomes are kept. */
const KEPT_TEXT_CHARS = 16 * 1024 * 1024;

const outcomes = new LRUCache<string, SpecDocument | Error>({ maxSize: KEPT_TEXT_CHARS, sizeCalculation: (_outcome, yaml) => Math.max(1, yaml.length) });

/** The spec of `yaml`, parsed once while it is kept; throws as parseSpec does. */
export function parsedSpec(yaml: string): SpecDocument {
  const outcome = outcomes.get(yaml) ?? parse(yaml);
  if (outcome instanceof Error) throw outcome;
  return outcome;
}

/** The spec of `yaml`, or null when it cannot be parsed; `onUnreadable` hears of a text once while it is kept. */
export function readableSpec(yaml: string, onUnreadable: (err: Error) => void): SpecDocument | null {
  const known = outcomes.get(yaml);
  if (known) return known instanceof Error ? null : known;
  const outcome = parse(yaml);
  if (!(outcome instanceof Error)) return outcome;
  onUnreadable(outcome);
  return null;
}

function parse(yaml: string): SpecDocument | Error {
  let outcome: SpecDocument | Error;
  try {
    outcome = parseSpec(yaml);
  } catch (err) {
    outcome = err instanceof Error ? err : new Error(String(err));
  }
  outcomes.set(yaml, outcome);
  return outcome;
}

const trees = new LRUCache<string, Record<string, unknown>>({ maxSize: KEPT_TEXT_CHARS, sizeCalculation: (_tree, yaml) => Math.max(1, yaml.length) });

/** The YAML tree of a spec text, unchecked, parsed once while it is kept; throws as the YAML parser does. */
export function specTree(yaml: string): Record<string, unknown> {
  let tree = trees.get(yaml);
  if (!tree) {
    tree = parseYaml(yaml) as Record<string, unknown>;
    trees.set(yaml, tree);
  }
  return tree;
}
