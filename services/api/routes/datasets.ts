/**
 * Datasets (docs/datasets.md): create, list, read and delete datasets (catalogs/dataset-catalog.ts,
 * from svc.datasets), add records as a new version, and read a version's records, filtered by
 * tags, a page at a time or as NDJSON (datasets/record-reads.ts, from ClickHouse).
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { datasetDetail, datasetView, recordsAt } from '../../domain/datasets.ts';
import type { DatasetChanged } from '../../domain/events/dataset-events.ts';
import type { DatasetCatalog } from '../catalogs/dataset-catalog.ts';
import { parseCreateDataset, parseRecordQuery, parseRecords } from '../datasets/dataset-request.ts';
import { recordPage, type RecordSelection } from '../datasets/record-reads.ts';
import { idempotencySeed } from '../middleware/idempotency.ts';
import { checkQueryParams, decodeCursor, encodeCursor, ndjsonStream, pageOf, parseLimit, wantsNdjson } from '../pagination.ts';
import { jsonBody } from '../request-body.ts';

const principal = (ctx: Context) => ctx.state.principal as Principal;

/** Version `version` of a dataset (null: the newest); 404 when it has no such version. */
function datasetVersion(dataset: DatasetChanged, version: number | null): number {
  if (version === null) return dataset.version;
  if (version > dataset.version) throw new AppError('not_found', `dataset ${dataset.dataset_id} has no version ${version} (its newest is ${dataset.version})`);
  return version;
}

export function datasetsRouter(kernel: Kernel, datasets: DatasetCatalog): Router {
  const router = new Router();
  const { config, store } = kernel;

  router.post('/v1/datasets', async (ctx) => {
    const request = parseCreateDataset(jsonBody(ctx));
    ctx.status = 201;
    ctx.body = datasetView(await datasets.create(principal(ctx).tenant, request, idempotencySeed(ctx)));
  });

  router.get('/v1/datasets', (ctx) => {
    checkQueryParams(ctx, ['name']);
    const name = ctx.query.name as string | undefined;
    const limit = parseLimit(ctx.query.limit, config);
    const after = decodeCursor(ctx.query.cursor, 1)?.[0];
    const rest = datasets.list(principal(ctx).tenant).filter((d) => (name === undefined || d.name === name) && (after === undefined || d.name > after));
    const items = rest.slice(0, limit);
    ctx.body = pageOf(items.map(datasetView), rest.length > limit ? encodeCursor([items[items.length - 1].name]) : null);
  });

  router.get('/v1/datasets/:id', (ctx) => {
    checkQueryParams(ctx, []);
    ctx.body = datasetDetail(datasets.owned(principal(ctx), ctx.params.id));
  });

  router.delete('/v1/datasets/:id', async (ctx) => {
    await datasets.delete(principal(ctx), ctx.params.id);
    ctx.body = { id: ctx.params.id, deleted: true };
  });

  router.post('/v1/datasets/:id/records', async (ctx) => {
    // The dataset first: an add to another tenant's dataset is a 403 whatever its body.
    datasets.owned(principal(ctx), ctx.params.id);
    const records = parseRecords(ctx.request.body, config);
    ctx.status = 201;
    ctx.body = await datasets.addRecords(principal(ctx), ctx.params.id, records, idempotencySeed(ctx));
  });

  router.get('/v1/datasets/:id/records', async (ctx) => {
    checkQueryParams(ctx, ['version', 'tags']);
    const query = parseRecordQuery(ctx.query, config);
    const dataset = datasets.owned(principal(ctx), ctx.params.id);
    const version = datasetVersion(dataset, query.version);
    const selection: RecordSelection = { tenant: dataset.tenant, datasetId: dataset.dataset_id, version, last: recordsAt(dataset, version), tags: query.tags };
    // Which version was read (the newest when none was asked): a client pins it for later reads.
    ctx.set('X-Dataset-Version', String(version));
    if (wantsNdjson(ctx)) {
      let after = query.after;
      ctx.type = 'application/x-ndjson';
      ctx.body = ndjsonStream(
        async () => {
          const page = await recordPage(store, selection, after, config.maxPageSize);
          after = page.lastSeq;
          return page;
        },
        ctx.query.limit === undefined ? null : query.limit,
      );
      return;
    }
    const page = await recordPage(store, selection, query.after, query.limit);
    ctx.body = pageOf(page.items, page.next);
  });

  return router;
}
