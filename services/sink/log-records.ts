/**
 * Log records as the rows of an Avro object container, for a store that makes table rows from
 * them itself (AvroInsertStore): each record's value as it is on the log, behind its position.
 * A row is the record `{log_partition: int, log_offset: long, value: <the topic's schema>}`, whose
 * Avro encoding is the position's encoding followed by the value's: a copy, not a re-encoding.
 */
import avro from 'avsc';
import type { LogRecord } from '../kernel/log/event-log.ts';
import type { EventSerde } from '../kernel/schema/serde.ts';
import { avroContainer } from '../kernel/schema/avro-container.ts';

const POSITION_FIELDS = [
  { name: 'log_partition', type: 'int' },
  { name: 'log_offset', type: 'long' },
] as const;

const POSITION = avro.Type.forSchema({ type: 'record', name: 'svc.sink.Position', fields: [...POSITION_FIELDS] });

export class LogRecordContainers {
  private readonly schema: object;

  constructor(
    private readonly serde: EventSerde,
    private readonly topic: string,
  ) {
    this.schema = { type: 'record', name: 'svc.sink.PositionedValue', fields: [...POSITION_FIELDS, { name: 'value', type: serde.type(topic).schema() }] };
  }

  /** One container row: the record's position and its value in this process's schema of the topic. */
  async row(record: LogRecord & { value: Buffer }): Promise<Buffer> {
    const body = await this.serde.currentBody(this.topic, record.value);
    return Buffer.concat([POSITION.toBuffer({ log_partition: record.partition, log_offset: record.offset }), body]);
  }

  container(rows: readonly Buffer[]): Buffer {
    return avroContainer(this.schema, rows);
  }
}
