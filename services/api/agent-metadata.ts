/**
 * The `metadata` field of POST /v1/agents: `{name, entrypoint, runtime?, tag?, auth?}`, checked
 * against a JSON Schema (ajv) and reported field by field (`metadata.auth.required_env[0]: ...`).
 */
import type { AgentAuth } from '../domain/agent-auth.ts';
import { AppError, badRequest } from '../kernel/errors.ts';
import { JsonSchemaValidator } from '../kernel/json-schema.ts';
import { checkJsonDepth } from './json-depth.ts';

export interface AgentMetadata {
  name: string;
  entrypoint: string[];
  runtime?: string;
  tag?: string;
  auth?: AgentAuth;
}

const AGENT_NAME = '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$';
const ENV_NAME = '^[A-Za-z_][A-Za-z0-9_]{0,127}$';
/** A hostname, or a glob whose first label is `*` (`*.example.com`). */
const HOST_PATTERN = '^(\\*\\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$';
/** A port (`443`) or a range (`8000-8100`). */
const PORT_PATTERN = '^[0-9]{1,5}(-[0-9]{1,5})?$';

const AGENT_AUTH_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  properties: {
    required_env: {
      type: 'array',
      items: { type: 'string', pattern: ENV_NAME, errorMessage: 'must be an env var name (letters, digits and _, not starting with a digit)' },
      uniqueItems: true,
      maxItems: 256,
    },
    config_files: {
      type: 'array',
      maxItems: 64,
      items: {
        type: 'object',
        additionalProperties: false,
        required: ['path', 'template'],
        properties: { path: { type: 'string', minLength: 1, maxLength: 1024 }, template: { type: 'string', maxLength: 65536 } },
      },
    },
    egress: {
      type: 'object',
      maxProperties: 256,
      propertyNames: { pattern: HOST_PATTERN, maxLength: 253, errorMessage: 'is not a hostname or a *.example.com glob' },
      additionalProperties: {
        type: 'array',
        items: { type: 'string', pattern: PORT_PATTERN, errorMessage: 'must be a port such as "443" or a range such as "8000-8100"' },
      },
    },
  },
} as const;

const METADATA_SCHEMA = {
  type: 'object',
  additionalProperties: false,
  required: ['name', 'entrypoint'],
  properties: {
    name: { type: 'string', pattern: AGENT_NAME, errorMessage: 'must be 1-128 letters, digits, ".", "_" and "-", starting with a letter or digit' },
    entrypoint: {
      type: 'array',
      minItems: 1,
      maxItems: 256,
      items: { type: 'string', minLength: 1, maxLength: 4096, errorMessage: 'must be a non-empty string' },
      errorMessage: 'must be a non-empty list of strings (exec form)',
    },
    runtime: { type: 'string', minLength: 1, maxLength: 128, errorMessage: 'must be a string of 1-128 characters' },
    tag: {
      type: 'string',
      pattern: AGENT_NAME,
      not: { const: 'latest' },
      errorMessage: 'must be 1-128 letters, digits, ".", "_" and "-", and not latest (set automatically to the newest version)',
    },
    auth: AGENT_AUTH_SCHEMA,
  },
} as const;

const validator = new JsonSchemaValidator(METADATA_SCHEMA);

const TEMPLATE_REFERENCE = /\{\{\s*secrets\.([^}\s]*)\s*\}\}/g;

/** Parses and checks the metadata JSON; throws a 400 listing every problem. */
export function parseAgentMetadata(raw: string | undefined): AgentMetadata {
  if (raw === undefined) throw badRequest('metadata', 'is required: a JSON field {name, entrypoint, runtime?, tag?, auth?}');
  checkJsonDepth(raw, 'metadata');
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (err) {
    throw badRequest('metadata', `is not valid JSON (${(err as Error).message})`);
  }
  const problems = validator.problems(value, 'metadata').map(({ path, problem }) => `${path}: ${problem}`);
  const metadata = value as AgentMetadata;
  if (problems.length === 0) {
    for (const [i, file] of (metadata.auth?.config_files ?? []).entries()) {
      const where = `metadata.auth.config_files[${i}]`;
      if (file.path.split('/').includes('..')) problems.push(`${where}.path: must not contain ".."`);
      else if (file.path.startsWith('/') && file.path !== '/workspace' && !file.path.startsWith('/workspace/')) {
        problems.push(`${where}.path: must be in the workspace: a relative path, ~/..., or under /workspace`);
      }
      for (const [, name] of file.template.matchAll(TEMPLATE_REFERENCE)) {
        if (!new RegExp(ENV_NAME).test(name)) problems.push(`${where}.template: {{secrets.${name}}} is not a valid secret name`);
      }
    }
    for (const [host, ports] of Object.entries(metadata.auth?.egress ?? {})) {
      for (const port of ports) {
        const [low, high = low] = port.split('-').map(Number);
        if (low < 1 || high > 65535 || high < low) problems.push(`metadata.auth.egress.${host}: port "${port}" is out of range 1-65535`);
      }
    }
  }
  if (problems.length > 0) throw new AppError('bad_request', problems.join('; '));
  return metadata;
}
