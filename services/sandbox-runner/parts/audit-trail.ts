/**
 * A sandbox's audit log (workspace/audit-log.ts), open from the runtime's start to the
 * teardown, and its records' way to svc.audit: appended in the order written, a burst as one
 * batch, each also an `audit` event of the sandbox's stream. Warnings go to both the stream and
 * the log; the ones written while the boot goes on are waited for by `ready`.
 */
import { publish, type Kernel } from '../../kernel/actor.ts';
import type { AuditRecorded } from '../../domain/events/sandbox-events.ts';
import { newEventId } from '../../kernel/ids.ts';
import { TOPICS } from '../../kernel/topics.ts';
import { AuditLog } from '../workspace/audit-log.ts';
import type { BackingOptions } from '../backing/backing-services.ts';
import type { EmitEvent } from './sandbox-events.ts';

export class AuditTrail {
  /** The log; null until the runtime started (boot/runtime.ts). */
  log: AuditLog | null = null;
  /** The audit records' appends to svc.audit, in the order they were written. */
  private auditChain: Promise<void> = Promise.resolve();
  private readonly queuedAudit: Array<{ ts: string; type: string; details: object }> = [];
  /** The append of the latest db_write record (appends keep their order). */
  private lastDbWrite: Promise<unknown> = Promise.resolve();
  /** Boot warnings on their way to the audit log: `ready` waits for them (a failed write fails the boot there). */
  private readonly bootWarnings: Array<Promise<void>> = [];

  constructor(
    private readonly kernel: Kernel,
    private readonly tenant: string,
    private readonly id: string,
    private readonly redact: (text: string) => string,
    private readonly event: EmitEvent,
  ) {}

  /** Opens the log in `workspace` (the runtime's: a warm sandbox's is where it was made). */
  open(workspace: string): void {
    const { config } = this.kernel;
    this.log = new AuditLog({
      workspace,
      sandboxId: this.id,
      redact: (text) => this.redact(text),
      onRecord: (r) => {
        this.queuedAudit.push(r);
        this.auditChain = this.auditChain
          .then(() => this.publishAudit())
          .catch((err) => this.kernel.logger.error({ err, sandbox_id: this.id }, 'audit records did not reach the log'));
      },
      recordsPerSecond: config.auditRecordsPerSecond,
      maxRecords: config.auditMaxRecords,
    });
  }

  /** Audit records dropped by the limits so far, by type (see AuditLog.dropped). */
  get dropped(): Record<string, number> {
    return this.log?.dropped ?? {};
  }

  /** A database's committed write (backing/, when audit.db_writes), recorded after the ones before it. */
  recordDbWrite(service: string, write: Parameters<BackingOptions['onWrite']>[1]): void {
    this.lastDbWrite = this.log?.record('db_write', { service, ...write }).catch(() => null) ?? this.lastDbWrite;
  }

  /** Resolves once every db_write record handed over so far is written. */
  async dbWritesRecorded(): Promise<void> {
    await this.lastDbWrite;
  }

  /** Resolves once every audit record written so far is on the log (svc.audit). */
  published(): Promise<void> {
    return this.auditChain;
  }

  /** A `warning` event, and the same warning in the audit log. */
  async warn(message: string): Promise<void> {
    void this.event('warning', { message });
    await this.log!.record('warning', { message });
  }

  /** warn, written while the boot goes on (the write is a file's open and append in the workspace, milliseconds on a busy disk). */
  warnWhileBooting(message: string): void {
    const written = this.warn(message);
    written.catch(() => {});
    this.bootWarnings.push(written);
  }

  /** Waits for the warnings written while booting; rejects when one could not be written. */
  async bootWarningsWritten(): Promise<void> {
    await Promise.all(this.bootWarnings.splice(0));
  }

  /** Closes the log (a teardown step); records written after it are not kept. */
  async close(): Promise<void> {
    await this.log?.close();
  }

  /** Appends the audit records written since the last append, in one batch (a burst is one append, not one per record). */
  private async publishAudit(): Promise<void> {
    const batch = this.queuedAudit.splice(0);
    if (batch.length === 0) return;
    const values = batch.map(
      (record): AuditRecorded => ({
        tenant: this.tenant,
        event_id: newEventId(),
        ts: Date.now(),
        sandbox_id: this.id,
        record_ts: Date.parse(record.ts),
        type: record.type,
        details: JSON.stringify(record.details),
      }),
    );
    await publish(
      this.kernel,
      TOPICS.audit,
      values.map((value) => ({ key: this.id, tenant: this.tenant, value })),
    );
    await Promise.all(batch.map((record) => this.event('audit', record)));
  }
}
