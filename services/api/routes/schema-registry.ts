/**
 * The built-in schema registry over HTTP: the subset of Confluent's Schema Registry REST API
 * that @kafkajs/confluent-schema-registry, Kafka serializers and common tools use. Mounted
 * under `/schema-registry`, so a client's registry URL is `<api>/schema-registry`.
 *
 * Requests may be `application/vnd.schemaregistry.v1+json`, `application/vnd.schemaregistry+json`
 * or `application/json`; answers are `application/vnd.schemaregistry.v1+json`; errors use
 * Confluent's body `{error_code, message}` (40401 subject, 40402 version, 40403 schema not
 * found, 40408 subject has no compatibility level, 409 incompatible, 42201 invalid schema,
 * 42202 invalid version, 42203 invalid compatibility level) rather than the service's
 * `{message, error}`, because that is what registry clients parse.
 * Only AVRO schemas are supported, without references.
 */
import { Router } from '@koa/router';
import type { Context, Next } from 'koa';
import { koaBody } from 'koa-body';
import {
  type BuiltInRegistry,
  type CompatibilityLevel,
  COMPATIBILITY_LEVELS,
  isCompatibilityLevel,
  REGISTRY_ERRORS,
  SchemaRegistryError,
} from '../../kernel/schema/registry.ts';
import { checkJsonDepth } from '../json-depth.ts';

const RESPONSE_TYPE = 'application/vnd.schemaregistry.v1+json';
const JSON_TYPES = ['application/vnd.schemaregistry.v1+json', 'application/vnd.schemaregistry+json', 'application/json'];
const MAX_VERSION = 2 ** 31 - 1;

/** Raised for a request the registry API refuses; rendered as `{error_code, message}`. */
class RegistryHttpError extends Error {
  constructor(
    readonly status: number,
    readonly errorCode: number,
    message: string,
  ) {
    super(message);
  }
}

// long: a router, one short handler per route of the Schema Registry API
export function schemaRegistryRouter(registry: BuiltInRegistry): Router {
  const router = new Router();
  const parseBody = jsonBody();

  router.get(
    '/subjects',
    handle(async (ctx) => registry.subjects().filter((s) => !ctx.query.subjectPrefix || s.startsWith(String(ctx.query.subjectPrefix)))),
  );

  router.get(
    '/subjects/:subject/versions',
    handle(async (ctx) => registry.versions(param(ctx, 'subject'))),
  );

  router.get(
    '/subjects/:subject/versions/:version',
    handle(async (ctx) => {
      // As Confluent, schemaType is left out for AVRO (its default).
      return registry.version(param(ctx, 'subject'), versionParam(param(ctx, 'version')));
    }),
  );

  router.get(
    '/subjects/:subject/versions/:version/schema',
    handle(async (ctx) => {
      // Confluent answers the schema itself, not wrapped in an object.
      return JSON.parse(registry.version(param(ctx, 'subject'), versionParam(param(ctx, 'version'))).schema) as unknown;
    }),
  );

  router.get(
    '/subjects/:subject/versions/:version/referencedby',
    handle(async (ctx) => {
      registry.version(param(ctx, 'subject'), versionParam(param(ctx, 'version')));
      return []; // references are not supported, so nothing refers to a version
    }),
  );

  router.post(
    '/subjects/:subject/versions',
    parseBody,
    handle(async (ctx) => {
      const schema = schemaBody(ctx);
      const registered = await registry.registerVersion(param(ctx, 'subject'), schema);
      return { id: registered.id };
    }),
  );

  router.post(
    '/subjects/:subject',
    parseBody,
    handle(async (ctx) => {
      return registry.lookup(param(ctx, 'subject'), schemaBody(ctx));
    }),
  );

  router.get(
    '/schemas/types',
    handle(async () => ['AVRO']),
  );

  router.get(
    '/schemas/ids/:id',
    handle(async (ctx) => ({ schema: registry.schemaById(idParam(ctx)) })),
  );

  router.get(
    '/schemas/ids/:id/schema',
    handle(async (ctx) => JSON.parse(registry.schemaById(idParam(ctx))) as unknown),
  );

  router.get(
    '/schemas/ids/:id/versions',
    handle(async (ctx) => registry.subjectsOfId(idParam(ctx))),
  );

  router.get(
    '/config',
    handle(async () => ({ compatibilityLevel: registry.compatibility() })),
  );

  router.put(
    '/config',
    parseBody,
    handle(async (ctx) => ({ compatibility: await registry.setCompatibility(undefined, levelBody(ctx)) })),
  );

  router.get(
    '/config/:subject',
    handle(async (ctx) => {
      const subject = param(ctx, 'subject');
      const own = registry.subjectCompatibility(subject);
      if (own) return { compatibilityLevel: own };
      if (ctx.query.defaultToGlobal === 'true') return { compatibilityLevel: registry.compatibility() };
      throw new RegistryHttpError(
        404,
        REGISTRY_ERRORS.subjectCompatibilityNotConfigured,
        `Subject '${subject}' does not have subject-level compatibility configured`,
      );
    }),
  );

  router.put(
    '/config/:subject',
    parseBody,
    handle(async (ctx) => ({
      compatibility: await registry.setCompatibility(param(ctx, 'subject'), levelBody(ctx)),
    })),
  );

  const compatibility = handle(async (ctx) => {
    const version = ctx.params.version === undefined ? undefined : versionParam(param(ctx, 'version'));
    const result = registry.checkCompatibility(param(ctx, 'subject'), schemaBody(ctx), version);
    return ctx.query.verbose === 'true' ? { is_compatible: result.isCompatible, messages: result.messages } : { is_compatible: result.isCompatible };
  });
  router.post('/compatibility/subjects/:subject/versions/:version', parseBody, compatibility);
  router.post('/compatibility/subjects/:subject/versions', parseBody, compatibility);

  return router;
}

type Handler = (ctx: Context) => Promise<unknown>;

/** Runs a handler and renders its answer or its error the way registry clients expect. */
function handle(fn: Handler) {
  return async (ctx: Context): Promise<void> => {
    try {
      const body = await fn(ctx);
      ctx.status = 200;
      ctx.body = body;
    } catch (err) {
      const { status, errorCode, message } = toRegistryError(err);
      ctx.status = status;
      ctx.body = { error_code: errorCode, message };
      if (status >= 500) ctx.app.emit('error', err, ctx);
    }
    ctx.type = RESPONSE_TYPE;
  };
}

function toRegistryError(err: unknown): { status: number; errorCode: number; message: string } {
  if (err instanceof RegistryHttpError) return { status: err.status, errorCode: err.errorCode, message: err.message };
  if (err instanceof SchemaRegistryError) {
    // Confluent's codes carry the HTTP status in their first three digits (409 is itself).
    const status = err.errorCode >= 10_000 ? Math.floor(err.errorCode / 100) : err.errorCode;
    return { status, errorCode: err.errorCode, message: err.message };
  }
  const e = err as { status?: unknown; expose?: unknown; message?: unknown };
  if (typeof e?.status === 'number' && e.status >= 400 && e.status < 500) {
    return { status: e.status, errorCode: e.status, message: typeof e.message === 'string' ? e.message : 'Bad request' };
  }
  if ((err as { code?: unknown })?.code === 'unavailable') return { status: 503, errorCode: 50003, message: (err as Error).message };
  return { status: 500, errorCode: REGISTRY_ERRORS.storeError, message: 'Internal server error' };
}

/** Parses JSON bodies of the registry's content types (leaves an already parsed body alone). */
function jsonBody() {
  const parser = koaBody({
    jsonTypes: JSON_TYPES,
    jsonLimit: '1mb',
    jsonStrict: true,
    includeUnparsed: true,
    urlencoded: false,
    text: false,
    multipart: false,
  });
  return async (ctx: Context, next: Next): Promise<void> => {
    if (ctx.request.body !== undefined) return next();
    try {
      await parser(ctx, async () => undefined);
      const { rawBody } = ctx.request as { rawBody?: unknown };
      if (typeof rawBody === 'string') checkJsonDepth(rawBody);
    } catch (err) {
      const e = err as { status?: number; message?: string };
      const status = e.status === 413 ? 413 : 400;
      ctx.status = status;
      ctx.type = RESPONSE_TYPE;
      ctx.body = {
        error_code: status === 413 ? 413 : 400,
        message: status === 413 ? 'Request body is larger than 1mb' : `Unparseable JSON body: ${e.message ?? ''}`,
      };
      return;
    }
    return next();
  };
}

function param(ctx: Context, name: string): string {
  return String((ctx as Context & { params: Record<string, string> }).params[name]);
}

function versionParam(raw: string): number | 'latest' {
  if (raw === 'latest' || raw === '-1') return 'latest';
  if (/^\d+$/.test(raw)) {
    const v = Number(raw);
    if (v >= 1 && v <= MAX_VERSION) return v;
  }
  throw new RegistryHttpError(
    422,
    REGISTRY_ERRORS.invalidVersion,
    `The specified version '${raw}' is not a valid version id. Allowed values are between [1, 2^31-1] and the string "latest"`,
  );
}

function idParam(ctx: Context): number {
  const raw = param(ctx, 'id');
  if (!/^\d+$/.test(raw)) throw new RegistryHttpError(404, REGISTRY_ERRORS.schemaNotFound, `Schema ${raw} not found`);
  return Number(raw);
}

function requestBody(ctx: Context): Record<string, unknown> {
  const body = (ctx.request as { body?: unknown }).body;
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new RegistryHttpError(422, REGISTRY_ERRORS.invalidSchema, 'Expected a JSON object body');
  }
  return body as Record<string, unknown>;
}

function schemaBody(ctx: Context): string {
  const body = requestBody(ctx);
  if (body.schemaType !== undefined && body.schemaType !== null && body.schemaType !== 'AVRO') {
    throw new RegistryHttpError(
      422,
      REGISTRY_ERRORS.invalidSchema,
      `Schema type ${JSON.stringify(body.schemaType)} is not supported; this registry holds AVRO schemas only`,
    );
  }
  if (Array.isArray(body.references) && body.references.length > 0) {
    throw new RegistryHttpError(422, REGISTRY_ERRORS.invalidSchema, 'Schema references are not supported by this registry');
  }
  if (typeof body.schema !== 'string') {
    throw new RegistryHttpError(422, REGISTRY_ERRORS.invalidSchema, 'Invalid schema: the body needs "schema", the schema as a JSON string');
  }
  return body.schema;
}

function levelBody(ctx: Context): CompatibilityLevel {
  const level = requestBody(ctx).compatibility;
  const normalized = typeof level === 'string' ? level.toUpperCase() : level;
  if (!isCompatibilityLevel(normalized)) {
    throw new RegistryHttpError(
      422,
      REGISTRY_ERRORS.invalidCompatibilityLevel,
      `Invalid compatibility level ${JSON.stringify(level)}. Valid values are ${COMPATIBILITY_LEVELS.join(', ')}`,
    );
  }
  return normalized;
}
