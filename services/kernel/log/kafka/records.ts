/** kafkajs messages to the seam's records. */
import type { IHeaders, KafkaMessage } from 'kafkajs';
import type { LogRecord } from '../event-log.ts';

export function toLogRecord(topic: string, partition: number, m: KafkaMessage): LogRecord {
  return {
    topic,
    partition,
    offset: Number(m.offset),
    key: m.key === null || m.key === undefined ? null : m.key.toString('utf8'),
    value: m.value ?? null,
    headers: headersToStrings(m.headers),
    timestamp: Number(m.timestamp),
  };
}

function headersToStrings(headers: IHeaders | undefined): Record<string, string> {
  const result: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers ?? {})) {
    if (value === undefined) continue;
    const last = Array.isArray(value) ? value[value.length - 1] : value;
    if (last === undefined) continue;
    result[name] = Buffer.isBuffer(last) ? last.toString('utf8') : String(last);
  }
  return result;
}
