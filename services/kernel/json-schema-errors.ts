/**
 * ajv's errors as the API's problems: one line per problem, named by its path in the document
 * (`metadata.auth.required_env[0]: ...`), deduplicated.
 */
import type { ErrorObject } from 'ajv';

/** `/auth/required_env/0` under `metadata` -> `metadata.auth.required_env[0]`. */
export function documentPath(root: string, instancePath: string): string {
  let out = root;
  for (const raw of instancePath.split('/').slice(1)) {
    const part = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    out += /^\d+$/.test(part) ? `[${part}]` : out === '' ? part : `.${part}`;
  }
  return out;
}

function join(parent: string, child: string): string {
  return parent === '' ? child : `${parent}.${child}`;
}

function describe(error: ErrorObject): string {
  const p = error.params as Record<string, unknown>;
  switch (error.keyword) {
    case 'type':
      return `must be ${String(p.type).replace('object', 'a mapping').replace('array', 'a list').replace(/^(string|number|integer|boolean|null)/, 'a $1')}`;
    case 'enum':
      return `must be one of ${(p.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
    case 'const':
      return `must be ${JSON.stringify(p.allowedValue)}`;
    case 'pattern':
      return `has the wrong form (expected ${String(p.pattern)})`;
    case 'minLength':
      return p.limit === 1 ? 'must not be empty' : `must be at least ${String(p.limit)} characters`;
    case 'maxLength':
      return `must be at most ${String(p.limit)} characters`;
    case 'minItems':
      return p.limit === 1 ? 'must not be empty' : `must have at least ${String(p.limit)} items`;
    case 'maxItems':
      return `must have at most ${String(p.limit)} items`;
    case 'maxProperties':
      return `must have at most ${String(p.limit)} entries`;
    case 'uniqueItems':
      return 'must not repeat an item';
    case 'minimum':
    case 'maximum':
    case 'exclusiveMinimum':
    case 'exclusiveMaximum':
      return `must be ${String(p.comparison)} ${String(p.limit)}`;
    case 'format':
      return `is not a valid ${String(p.format)}`;
    default:
      return error.message ?? 'is invalid';
  }
}

/**
 * The problems of a failed validation. `overrides` replace the message of a path (e.g. a
 * friendlier word for a `not` rule). Errors of a `propertyNames` rule name the offending key.
 */
export function describeSchemaErrors(errors: readonly ErrorObject[], root: string, overrides: Record<string, string> = {}): string[] {
  const problems = new Set<string>();
  for (const error of errors) {
    const where = documentPath(root, error.instancePath);
    const p = error.params as Record<string, unknown>;
    if (error.keyword === 'required') problems.add(`${join(where, String(p.missingProperty))}: is required`);
    else if (error.keyword === 'additionalProperties') problems.add(`${join(where, String(p.additionalProperty))}: unknown field`);
    else if (error.keyword === 'propertyNames') continue; // its nested error, below, names the key
    else if (error.propertyName !== undefined) problems.add(`${where}: key ${JSON.stringify(error.propertyName)} ${describe(error)}`);
    else problems.add(`${where}: ${overrides[where] ?? describe(error)}`);
  }
  return [...problems];
}
