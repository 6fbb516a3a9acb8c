/**
 * Agent snapshots: POST /v1/agents (multipart `metadata` JSON + `bundle` .tar.gz, streamed to the
 * blob store), the reads by name, tag, version and id, and DELETE /v1/snapshots/:id.
 */
import Router from '@koa/router';
import { idempotencySeed } from '../middleware/idempotency.ts';
import busboy from 'busboy';
import type { Context } from 'koa';
import type { Principal } from '../../kernel/auth.ts';
import type { ReceivedBundle } from '../../kernel/bundles.ts';
import type { Config } from '../../kernel/config.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { parseAgentMetadata } from '../agent-metadata.ts';
import { snapshotView, type AgentCatalog } from '../catalogs/agent-catalog.ts';
import { checkQueryParams, decodeCursor, encodeCursor, parseLimit, type Page } from '../pagination.ts';
import type { AgentSnapshotChanged } from '../../domain/events/agent-events.ts';

const METADATA_MAX_BYTES = 64 * 1024;

/** Reads the multipart body: the metadata text and the bundle, streamed through the store's checks. */
async function receiveUpload(
  ctx: Context,
  agents: AgentCatalog,
  config: Config,
): Promise<{ metadata: string | undefined; bundle: ReceivedBundle | undefined }> {
  if (!ctx.is('multipart/form-data')) {
    throw new AppError('unsupported_media_type', 'body: send multipart/form-data with a `metadata` JSON field and a `bundle` .tar.gz file');
  }
  // A body declared far past the limit is refused before it is read (and the connection closed);
  // one near it is read and dropped, so that clients still sending can read the answer.
  const declared = Number(ctx.get('Content-Length') || 0);
  if (declared > 2 * config.agentMaxSizeBytes + METADATA_MAX_BYTES) {
    ctx.set('Connection', 'close');
    throw new AppError('payload_too_large', `bundle: larger than the agent snapshot size limit of ${config.agentMaxSizeBytes} bytes (agents.max_size)`);
  }
  let parser: busboy.Busboy;
  try {
    parser = busboy({ headers: ctx.req.headers, limits: { files: 1, fields: 4, parts: 6, fieldSize: METADATA_MAX_BYTES } });
  } catch (err) {
    throw badRequest('body', `is not a readable multipart body (${(err as Error).message})`);
  }
  let metadata: string | undefined;
  let bundle: Promise<ReceivedBundle> | undefined;
  let bundleStream: (NodeJS.ReadableStream & { destroy(err?: Error): void }) | undefined;
  const problems: AppError[] = [];
  parser.on('field', (name, value, info) => {
    if (name !== 'metadata') problems.push(badRequest(name, 'unknown form field; send `metadata` and `bundle`'));
    else if (info.valueTruncated) problems.push(badRequest('metadata', `is larger than ${METADATA_MAX_BYTES} bytes`));
    else metadata = value;
  });
  parser.on('file', (name, stream) => {
    if (name !== 'bundle' || bundle) {
      problems.push(badRequest(name, name === 'bundle' ? 'sent twice' : 'unknown file field; send the archive as `bundle`'));
      stream.resume();
      return;
    }
    bundleStream = stream;
    bundle = agents.bundles.receive(stream, { bytes: config.agentMaxSizeBytes, name: 'agents.max_size' });
    bundle.catch(() => {}); // awaited below, after the whole body is read
  });
  for (const limit of ['partsLimit', 'filesLimit', 'fieldsLimit'] as const) {
    parser.on(limit, () => problems.push(badRequest('body', 'has more parts than `metadata` and one `bundle`')));
  }
  await new Promise<void>((resolve, reject) => {
    parser.on('close', resolve);
    parser.on('error', (err: Error) => reject(badRequest('body', `is not a readable multipart body (${err.message})`)));
    const interrupted = (err?: Error) => {
      const problem = badRequest('body', `the upload was interrupted${err ? ` (${err.message})` : ''}`);
      bundleStream?.destroy(problem); // so the half-written temporary file is removed
      reject(problem);
    };
    ctx.req.on('error', interrupted);
    ctx.req.on('close', () => {
      if (!ctx.req.complete) interrupted();
    });
    ctx.req.pipe(parser);
  });
  const received = await bundle;
  if (problems.length > 0) {
    if (received) await agents.bundles.discard(received);
    throw problems[0];
  }
  return { metadata, bundle: received };
}

function versionParam(raw: string): number {
  if (!/^[1-9]\d{0,8}$/.test(raw)) throw badRequest('version', 'must be a positive integer');
  return Number(raw);
}

/** A page of rows sorted by `key`, after the cursor's key. */
function page(ctx: Context, config: Config, rows: AgentSnapshotChanged[], key: (row: AgentSnapshotChanged) => string): Page<ReturnType<typeof snapshotView>> {
  const limit = parseLimit(ctx.query.limit, config);
  const after = decodeCursor(ctx.query.cursor, 1)?.[0];
  const rest = after === undefined ? rows : rows.filter((r) => key(r) > after);
  const items = rest.slice(0, limit);
  return {
    items: items.map(snapshotView),
    ...(rest.length > limit ? { next_cursor: encodeCursor([key(items[items.length - 1])]) } : {}),
    count: items.length,
  };
}

export function agentsRouter(agents: AgentCatalog, config: Config): Router {
  const router = new Router();
  const tenant = (ctx: Context) => (ctx.state.principal as Principal).tenant;

  router.post('/v1/agents', async (ctx) => {
    const { metadata, bundle } = await receiveUpload(ctx, agents, config);
    let parsed: ReturnType<typeof parseAgentMetadata>;
    try {
      if (!bundle) throw badRequest('bundle', 'is required: the agent code as a .tar.gz file field');
      parsed = parseAgentMetadata(metadata);
    } catch (err) {
      if (bundle) await agents.bundles.discard(bundle);
      throw err;
    }
    ctx.status = 201;
    ctx.body = await agents.create(tenant(ctx), parsed, bundle, idempotencySeed(ctx));
  });

  router.get('/v1/agents', (ctx) => {
    checkQueryParams(ctx, []);
    ctx.body = page(ctx, config, agents.agents(tenant(ctx)), (r) => r.name);
  });

  router.get('/v1/agents/:name/latest', (ctx) => {
    checkQueryParams(ctx, []);
    ctx.body = snapshotView(agents.latest(tenant(ctx), ctx.params.name));
  });

  router.get('/v1/agents/:name/tags/:tag', (ctx) => {
    checkQueryParams(ctx, []);
    ctx.body = snapshotView(agents.byTag(tenant(ctx), ctx.params.name, ctx.params.tag));
  });

  router.get('/v1/agents/:name/versions', (ctx) => {
    checkQueryParams(ctx, []);
    // Versions sort as numbers; the cursor holds a zero-padded version so string order is numeric order.
    ctx.body = page(ctx, config, agents.versions(tenant(ctx), ctx.params.name), (r) => String(r.version).padStart(10, '0'));
  });

  router.get('/v1/agents/:name/versions/:version', (ctx) => {
    checkQueryParams(ctx, []);
    ctx.body = snapshotView(agents.byVersion(tenant(ctx), ctx.params.name, versionParam(ctx.params.version)));
  });

  router.get('/v1/snapshots/:id', (ctx) => {
    checkQueryParams(ctx, []);
    ctx.body = snapshotView(agents.byId(tenant(ctx), ctx.params.id));
  });

  router.delete('/v1/snapshots/:id', async (ctx) => {
    await agents.delete(tenant(ctx), ctx.params.id);
    ctx.body = { id: ctx.params.id, deleted: true };
  });

  return router;
}
