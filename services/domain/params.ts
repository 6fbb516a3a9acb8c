/**
 * Matrix parameters: the one grammar of `{{ params.NAME }}` in a spec's strings. A matrix entry
 * (parallelism.matrix, or an experiment's own) gives each NAME a value; spec validation, the
 * experiment request's matrix check and the run's spec all read references through this file.
 */

export type ParamValue = string | number | boolean;
/** One matrix entry: parameter name -> value. Names are identifiers (the spec's JSON Schema). */
export type Params = Record<string, ParamValue>;

/**
 * A reference as written. The name is taken as written, identifier or not, so a reference no
 * matrix can define (`{{ params.a-b }}`) is reported by validation instead of staying literal.
 */
const REFERENCE = /\{\{\s*params\.([^}\s]*)\s*\}\}/g;

/** The parameter names a string refers to, in order. */
export function referencedNames(text: string): string[] {
  return [...text.matchAll(REFERENCE)].map((m) => m[1]);
}

/** Every reference of a string replaced by its value; a name the entry lacks stays as written. */
export function applyParams(text: string, params: Params): string {
  return text.replace(REFERENCE, (match, name: string) => (Object.hasOwn(params, name) ? String(params[name]) : match));
}

/** Matrix entries reach the agent and the checks as SVC_PARAM_<NAME> environment variables. */
export function paramsEnv(params: Params): Record<string, string> {
  return Object.fromEntries(Object.entries(params).map(([name, value]) => [`SVC_PARAM_${name.toUpperCase()}`, String(value)]));
}

/** Whether a document path lies under `parallelism`, whose strings define parameters rather than use them. */
export function definesParams(path: string): boolean {
  return path === 'parallelism' || path.startsWith('parallelism.');
}

/** The parameter names a parsed spec document's strings refer to (outside parallelism). */
export function referencedParams(doc: Record<string, unknown>): Set<string> {
  const names = new Set<string>();
  const visit = (value: unknown): void => {
    if (typeof value === 'string') for (const name of referencedNames(value)) names.add(name);
    else if (Array.isArray(value)) value.forEach(visit);
    else if (value !== null && typeof value === 'object') Object.values(value).forEach(visit);
  };
  for (const [key, value] of Object.entries(doc)) if (!definesParams(key)) visit(value);
  return names;
}
