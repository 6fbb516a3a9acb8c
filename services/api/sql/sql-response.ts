/**
 * A query's result as a ClickHouse server sends it: the X-ClickHouse-* headers (query id, format,
 * time zone, server name, the summary of what was read), the format's content type, and with
 * `enable_http_compression=1` the body compressed in the first encoding of Accept-Encoding that
 * is gzip, deflate or br.
 */
import { hostname } from 'node:os';
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import type { Context } from 'koa';
import type { SqlResult } from './analyst-queries.ts';

const BINARY_FORMATS = /^(Native|RowBinary.*|Parquet|Arrow|ArrowStream|ORC|Avro|Protobuf.*|CapnProto|MsgPack|BSONEachRow|Npy|Buffers)$/i;

const COMPRESS = { gzip: promisify(zlib.gzip), deflate: promisify(zlib.deflate), br: promisify(zlib.brotliCompress) };

const DISPLAY_NAME = hostname();

function contentType(format: string): string {
  if (BINARY_FORMATS.test(format)) return 'application/octet-stream';
  if (
    /^(JSON|JSONCompact|JSONStrings|JSONCompactStrings|JSONColumns|JSONCompactColumns|JSONColumnsWithMetadata|JSONObjectEachRow|PrettyJSONEachRow)$/i.test(
      format,
    )
  )
    return 'application/json; charset=UTF-8';
  if (/EachRow|^JSONLines$|^NDJSON$/i.test(format)) return 'application/x-ndjson; charset=UTF-8';
  if (/^(TabSeparated|TSV)/i.test(format)) return 'text/tab-separated-values; charset=UTF-8';
  if (/^CSV/i.test(format)) return 'text/csv; charset=UTF-8; header=absent';
  if (/^XML$/i.test(format)) return 'application/xml; charset=UTF-8';
  return 'text/plain; charset=UTF-8';
}

/** The first encoding of Accept-Encoding this endpoint can produce. */
function responseEncoding(accept: string): 'gzip' | 'deflate' | 'br' | null {
  for (const part of accept.split(',')) {
    const name = part.split(';')[0].trim().toLowerCase();
    if (name === 'gzip' || name === 'deflate' || name === 'br') return name;
  }
  return null;
}

/** Renders a result; `compress` is the request's `enable_http_compression=1`. */
export async function renderSqlResult(ctx: Context, result: SqlResult, queryId: string, compress: boolean): Promise<void> {
  const { format, stats } = result;
  let bytes = result.bytes;
  ctx.status = 200;
  ctx.set('X-ClickHouse-Query-Id', queryId);
  ctx.set('X-ClickHouse-Format', format);
  ctx.set('X-ClickHouse-Timezone', 'UTC');
  ctx.set('X-ClickHouse-Server-Display-Name', DISPLAY_NAME);
  ctx.set(
    'X-ClickHouse-Summary',
    JSON.stringify({
      read_rows: String(stats.rowsRead),
      read_bytes: String(stats.bytesRead),
      written_rows: '0',
      written_bytes: '0',
      total_rows_to_read: String(stats.rowsRead),
      result_rows: '0',
      result_bytes: String(bytes.length),
      elapsed_ns: String(Math.round(stats.elapsedMs * 1e6)),
    }),
  );
  ctx.type = contentType(format);
  const encoding = compress ? responseEncoding(ctx.get('Accept-Encoding')) : null;
  if (encoding) {
    bytes = await COMPRESS[encoding](bytes);
    ctx.set('Content-Encoding', encoding);
  }
  ctx.body = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}
