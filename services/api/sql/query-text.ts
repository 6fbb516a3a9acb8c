/**
 * The text of an analyst's query: the URL's `query`, a POST body (gzip, deflate or br
 * decompressed), or both, joined with a newline as ClickHouse joins them; at most 1 MiB.
 */
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import { SqlError } from './sql-errors.ts';

/** Largest query text (URL query plus body) accepted. */
const MAX_QUERY_BYTES = 1 << 20;

const INFLATE: Record<string, (body: Buffer, options: { maxOutputLength: number }) => Promise<Buffer>> = {
  gzip: promisify(zlib.gunzip),
  'x-gzip': promisify(zlib.gunzip),
  deflate: promisify(zlib.inflate),
  br: promisify(zlib.brotliDecompress),
};

/** A POST body as text, decompressed by its Content-Encoding; a too large or undecodable body is a SqlError. */
export async function readQueryBody(chunks: AsyncIterable<Buffer>, contentEncoding: string): Promise<string> {
  const limit = MAX_QUERY_BYTES;
  const read: Buffer[] = [];
  let size = 0;
  for await (const chunk of chunks) {
    size += chunk.length;
    if (size > limit * 4) throw new SqlError(62, 'SYNTAX_ERROR', `Max query size exceeded: the body is larger than ${limit} bytes`, 413);
    read.push(chunk);
  }
  let body: Buffer = Buffer.concat(read);
  const encoding = contentEncoding.trim().toLowerCase();
  if (encoding && encoding !== 'identity') {
    const inflate = INFLATE[encoding];
    if (!inflate) throw new SqlError(48, 'NOT_IMPLEMENTED', `Content-Encoding ${encoding} is not supported: use gzip, deflate or br`, 415);
    try {
      body = await inflate(body, { maxOutputLength: limit + 1 });
    } catch (err) {
      throw new SqlError(62, 'SYNTAX_ERROR', `Cannot decompress the ${encoding} body: ${(err as Error).message}`, 400);
    }
  }
  if (body.length > limit) throw new SqlError(62, 'SYNTAX_ERROR', `Max query size exceeded: the query is larger than ${limit} bytes`, 413);
  return body.toString('utf8');
}

/** The query: the URL's and the body's text joined; too large or holding a NUL byte is a SqlError. */
export function queryText(urlQuery: string, body: string): string {
  const sql = urlQuery && body ? `${urlQuery}\n${body}` : urlQuery || body;
  if (Buffer.byteLength(sql) > MAX_QUERY_BYTES)
    throw new SqlError(62, 'SYNTAX_ERROR', `Max query size exceeded: the query is larger than ${MAX_QUERY_BYTES} bytes`, 413);
  if (sql.includes('\0')) throw new SqlError(62, 'SYNTAX_ERROR', 'The query contains a NUL byte', 400);
  return sql;
}
