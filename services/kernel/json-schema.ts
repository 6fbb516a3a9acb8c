/**
 * JSON Schema validation (ajv) with the API's error style: one `path: problem` per problem, in
 * the document's own words (`invariants.tests_pass.check.type: unknown type "foo"; one of ...`),
 * without ajv's compound-keyword noise.
 *
 * Schemas may give a constrained value an `errorMessage` (a string): editors that read JSON
 * Schema (VS Code, yaml-language-server) show it, and so do these problems. A variant chosen by
 * a tag (`if: {properties: {type: {const: cli}}}, then: {...}`) names the tag in its problems
 * (`is not a field for type: cli`).
 */
import { Ajv, type ErrorObject, type ValidateFunction } from 'ajv';
import { isObject } from './is-object.ts';

type Schema = Record<string, unknown>;
export interface Problem {
  path: string;
  problem: string;
}

const list = (values: unknown): string => (Array.isArray(values) ? values.map(String).join(', ') : '');

export const succeeds = (f: () => unknown): boolean => {
  try {
    f();
    return true;
  } catch {
    return false;
  }
};

/** `parent.key`, or `parent["odd key"]` when the key would not read as one path segment. */
export function childPath(parent: string, key: string): string {
  if (!/^[A-Za-z0-9_-]+$/.test(key)) return `${parent}[${JSON.stringify(key)}]`;
  return parent === '' ? key : `${parent}.${key}`;
}

export class JsonSchemaValidator {
  private readonly validate: ValidateFunction;
  /** Each `then` of a tagged variant -> ` for type: cli`. */
  private readonly variantOf = new Map<unknown, string>();

  /** `formats`: string formats of the schema beyond `regex`, by name. */
  constructor(
    private readonly schema: Schema,
    formats: Record<string, (value: string) => boolean> = {},
  ) {
    // strictRequired off: `anyOf: [{required: [a]}, {required: [b]}]` names fields declared beside it.
    const ajv = new Ajv({ allErrors: true, verbose: true, strict: true, strictRequired: false, allowUnionTypes: true });
    ajv.addKeyword({ keyword: 'errorMessage', schemaType: 'string' });
    ajv.addFormat('regex', { type: 'string', validate: (s: string) => succeeds(() => new RegExp(s)) });
    for (const [name, validate] of Object.entries(formats)) ajv.addFormat(name, { type: 'string', validate });
    this.validate = ajv.compile(schema);
    this.indexVariants(schema);
  }

  /** Every problem of `doc`, named by path under `root` (`metadata.auth...`); empty when valid. */
  problems(doc: unknown, root = ''): Problem[] {
    if (this.validate(doc)) return [];
    const errors = this.validate.errors ?? [];
    // An anyOf carries its own message; the failures of its branches are noise. (schemaPaths are
    // relative to the definition a $ref entered, so the instance path is compared too.)
    const compounds = errors.filter((e) => e.keyword === 'anyOf');
    const inCompound = (e: ErrorObject) => compounds.some((c) => e.schemaPath.startsWith(`${c.schemaPath}/`) && e.instancePath.startsWith(c.instancePath));
    const problems = errors
      .filter((e) => e.keyword !== 'if' && e.keyword !== 'propertyNames' && !inCompound(e))
      .map((error) => this.describe(doc, root, error));
    const seen = new Set<string>();
    return problems.filter((p) => !seen.has(`${p.path}\n${p.problem}`) && seen.add(`${p.path}\n${p.problem}`));
  }

  private describe(doc: unknown, root: string, error: ErrorObject): Problem {
    const at = pathOf(doc, root, error.instancePath);
    const p = error.params as Record<string, unknown>;
    const parent = error.parentSchema as Schema | undefined;
    const message = typeof parent?.errorMessage === 'string' ? parent.errorMessage : undefined;
    if (error.propertyName !== undefined) return { path: childPath(at, error.propertyName), problem: message ?? 'is not a valid name' };
    switch (error.keyword) {
      case 'required': {
        const name = String(p.missingProperty);
        const allowed = this.resolved(this.resolved(parent?.properties)?.[name])?.enum;
        return { path: childPath(at, name), problem: `is required${this.variantOf.get(parent) ?? ''}${allowed ? `; one of ${list(allowed)}` : ''}` };
      }
      case 'additionalProperties': {
        const fields = Object.keys(this.resolved(parent?.properties) ?? {});
        const variant = this.variantOf.get(parent);
        return {
          path: childPath(at, String(p.additionalProperty)),
          problem: `${variant ? `is not a field${variant}` : 'unknown field'}; the fields are ${fields.join(', ')}`,
        };
      }
      case 'enum':
        return {
          path: at,
          problem: /(^|\.)type$/.test(at)
            ? `unknown type ${JSON.stringify(error.data)}; one of ${list(p.allowedValues)}`
            : `must be one of ${list(p.allowedValues)}`,
        };
      case 'const':
        return { path: at, problem: `must be ${String(p.allowedValue)}` };
      case 'uniqueItems':
        return { path: at, problem: `must not repeat an item (items ${String(p.j)} and ${String(p.i)} are the same)` };
      default:
        return { path: at, problem: message ?? error.message ?? 'is invalid' };
    }
  }

  private indexVariants(node: unknown): void {
    if (Array.isArray(node)) {
      for (const n of node) this.indexVariants(n);
      return;
    }
    if (!isObject(node)) return;
    const tags = isObject(node.if) && isObject(node.if.properties) ? Object.entries(node.if.properties) : [];
    const [tag, rule] = tags[0] ?? [];
    if (tag !== undefined && isObject(rule) && 'const' in rule) this.variantOf.set(node.then, ` for ${tag}: ${String(rule.const)}`);
    for (const n of Object.values(node)) this.indexVariants(n);
  }

  /** The node a `$ref` names (`#/definitions/checkType`), or the node itself. */
  private resolved(node: unknown): Schema | undefined {
    if (!isObject(node) || typeof node.$ref !== 'string') return isObject(node) ? node : undefined;
    const [, name] = /^#\/definitions\/(.+)$/.exec(node.$ref) ?? [];
    const definitions = this.schema.definitions;
    const target = isObject(definitions) ? definitions[name] : undefined;
    return isObject(target) ? target : undefined;
  }
}

/** An ajv instancePath (`/invariants/a.b/check`) in the document's words (`invariants["a.b"].check`). */
function pathOf(doc: unknown, root: string, instancePath: string): string {
  let path = root;
  let node = doc;
  for (const raw of instancePath.split('/').slice(1)) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    path = Array.isArray(node) ? `${path}[${key}]` : childPath(path, key);
    node = isObject(node) || Array.isArray(node) ? (node as Record<string, unknown>)[key] : undefined;
  }
  return path;
}
