/**
 * Local validation of a spec file before it is pushed: the same checks the service runs on
 * upload (services/domain/spec.ts: the published JSON Schema schemas/spec.schema.json, then the
 * rules a schema cannot say), with each problem placed at its line and column in the file, as
 * compilers and editors print them: `spec.yaml:12:5: invariants.a.check.type: unknown type`.
 *
 * The domain layer is pure (no I/O), so the client reuses it rather than a copy that could drift;
 * checks that need the tenant's data (a snapshot id, a bundle digest, allowed secret sources) are
 * the service's, at push.
 */
import { isMap, isPair, isScalar, isSeq, LineCounter, parseDocument, type Node } from 'yaml';
import { parseSpec, type SpecDocument } from '../../../services/domain/spec.ts';

export interface SpecProblem {
  line: number;
  column: number;
  /** `path: problem`, as the service words it. */
  message: string;
}

export type SpecCheck = { ok: true; spec: SpecDocument } | { ok: false; problems: SpecProblem[] };

/** One step of a problem's path: a field name or a list index. */
type Step = string | number;

const PATH_AT_START = /^((?:[A-Za-z0-9_-]+|\[\d+\]|\["(?:[^"\\]|\\.)*"\])(?:\.[A-Za-z0-9_-]+|\[\d+\]|\["(?:[^"\\]|\\.)*"\])*): /;
const YAML_ERROR = /^malformed YAML at line (\d+), column (\d+): (.*)$/;

export function checkSpec(text: string): SpecCheck {
  try {
    return { ok: true, spec: parseSpec(text) };
  } catch (err) {
    const message = (err as Error).message.replace(/^spec: /, '');
    const yamlError = YAML_ERROR.exec(message);
    if (yamlError) return { ok: false, problems: [{ line: Number(yamlError[1]), column: Number(yamlError[2]), message: `malformed YAML: ${yamlError[3]}` }] };
    return { ok: false, problems: locate(text, splitProblems(message)) };
  }
}

/**
 * The service joins its problems with "; " (and a problem's own text may hold "; "): a new
 * problem starts where a path followed by ": " does.
 */
export function splitProblems(message: string): string[] {
  const problems: string[] = [];
  for (const part of message.split('; ')) {
    if (problems.length === 0 || PATH_AT_START.test(part)) problems.push(part);
    else problems[problems.length - 1] += `; ${part}`;
  }
  return problems;
}

/** `invariants["a b"].check[0]` -> ['invariants', 'a b', 'check', 0]. */
export function pathSteps(path: string): Step[] {
  const steps: Step[] = [];
  for (const m of path.matchAll(/([A-Za-z0-9_-]+)|\[(\d+)\]|\[("(?:[^"\\]|\\.)*")\]/g)) {
    if (m[1] !== undefined) steps.push(m[1]);
    else if (m[2] !== undefined) steps.push(Number(m[2]));
    else steps.push(JSON.parse(m[3]) as string);
  }
  return steps;
}

/** Each problem at the deepest node of its path that the file has (the key of a field, the item of a list). */
function locate(text: string, problems: string[]): SpecProblem[] {
  const lines = new LineCounter();
  const doc = parseDocument(text, { lineCounter: lines, keepSourceTokens: false });
  const at = (offset: number) => lines.linePos(offset);
  return problems.map((message) => {
    const path = PATH_AT_START.exec(message)?.[1];
    const offset = path === undefined ? 0 : deepestOffset(doc.contents as Node | null, pathSteps(path));
    const { line, col } = at(offset);
    return { line, column: col, message };
  });
}

function deepestOffset(root: Node | null, steps: Step[]): number {
  let node: Node | null = root;
  let offset = node?.range?.[0] ?? 0;
  for (const step of steps) {
    if (isMap(node)) {
      const pair = node.items.find((p) => isPair(p) && isScalar(p.key) && String(p.key.value) === String(step));
      if (!pair) break;
      offset = (pair.key as Node).range?.[0] ?? offset;
      node = pair.value as Node | null;
    } else if (isSeq(node) && typeof step === 'number') {
      const item = node.items[step] as Node | undefined;
      if (!item) break;
      offset = item.range?.[0] ?? offset;
      node = item;
    } else {
      break;
    }
  }
  return offset;
}
