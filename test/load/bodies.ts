/**
 * The request bodies of the ingest bench, shared by the bench (which posts them) and by
 * chdb-direct.ts (which turns the same events into the sink's rows for the chDB-alone ceiling).
 */
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import protobuf from 'protobufjs';
import { REPO, traceEvent } from '../helpers/server.ts';

/** POST /v1/traces bodies: 1,000 events of ~650 bytes each; `count` distinct bodies. */
export function traceBodies(count: number): string[] {
  return Array.from({ length: count }, (_, b) =>
    JSON.stringify({
      events: Array.from({ length: 1000 }, (_, i) =>
        traceEvent({ tool: `tool-${i % 20}`, span_id: `b${b}-${i}`, input: 'i'.repeat(200), output: 'o'.repeat(200), metadata: { 'gen_ai.system': 'openai' } }),
      ),
    }),
  );
}

/** OTLP/HTTP protobuf bodies of 1,000 spans each (half gen_ai model calls); distinct span ids per body. */
export function otlpBodies(count: number): Uint8Array[] {
  const root = new protobuf.Root();
  const protoDir = path.join(REPO, 'services', 'api', 'traces', 'otlp-proto');
  root.resolvePath = (_origin, target) => (path.isAbsolute(target) ? target : path.join(protoDir, target));
  root.loadSync('opentelemetry/proto/collector/trace/v1/trace_service.proto');
  const Request = root.lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
  const now = BigInt(Date.now()) * 1_000_000n;
  const attr = (k: string, v: string | number) => ({ key: k, value: typeof v === 'number' ? { intValue: v } : { stringValue: v } });
  return Array.from({ length: count }, (_, b) =>
    Request.encode(
      Request.fromObject({
        resourceSpans: [
          {
            resource: { attributes: [attr('service.name', 'bench-agent')] },
            scopeSpans: [
              {
                spans: Array.from({ length: 1000 }, (_, i) => ({
                  traceId: randomBytes(16),
                  spanId: randomBytes(8),
                  name: i % 2 ? 'chat gpt-4o' : `tool-${i % 20}`,
                  startTimeUnixNano: String(now + BigInt(b * 1000 + i)),
                  endTimeUnixNano: String(now + BigInt(b * 1000 + i) + 5_000_000n),
                  attributes:
                    i % 2
                      ? [
                          attr('gen_ai.operation.name', 'chat'),
                          attr('gen_ai.request.model', 'gpt-4o'),
                          attr('gen_ai.usage.input_tokens', 900),
                          attr('gen_ai.usage.output_tokens', 120),
                          attr('gen_ai.prompt', 'p'.repeat(200)),
                        ]
                      : [attr('tool.args', 'a'.repeat(200))],
                  status: { code: 1 },
                })),
              },
            ],
          },
        ],
      }),
    ).finish(),
  );
}
