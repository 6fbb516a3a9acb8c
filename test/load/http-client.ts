/**
 * The ingest bench's clients: POSTs over node:http with keep-alive connections. The clients
 * share the service's two cores, so what they cost is taken from the service: posting a
 * 650 KB body took 1.5-2.4 ms of CPU with fetch (undici) against 0.36-0.55 ms with node:http
 * (measured 2026-12-02), 5.4 µs per ingested event against about 1.
 */
import http from 'node:http';

export interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  text: string;
}

/** A keep-alive client of one server: at most `connections` requests at once each on its own connection. */
export function httpClient(
  baseUrl: string,
  connections: number,
): { post: (path: string, headers: Record<string, string>, body: Uint8Array) => Promise<Reply>; close: () => void } {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections });
  const post = (path: string, headers: Record<string, string>, body: Uint8Array) =>
    new Promise<Reply>((resolve, reject) => {
      const req = http.request(new URL(path, baseUrl), { method: 'POST', agent, headers: { ...headers, 'content-length': String(body.byteLength) } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, text: Buffer.concat(chunks).toString('utf8') }));
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(body);
    });
  return { post, close: () => agent.destroy() };
}
