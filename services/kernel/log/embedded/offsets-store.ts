/**
 * Committed consumer-group offsets of the embedded log: an append-only file of JSON lines
 * `[group, topic, partition, offset]`, replayed on open (a torn last line is dropped) and
 * rewritten as a snapshot (write, fsync, rename) when it grows.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { BackendLogger } from '../event-log.ts';
import type { SyncScheduler } from './sync.ts';

const REWRITE_BYTES = 4 * 1024 * 1024;

export class OffsetStore {
  private readonly file: string;
  fd = -1;
  private size = 0;
  private readonly offsets = new Map<string, Map<string, number[]>>();

  constructor(
    dir: string,
    private readonly sync: SyncScheduler,
    private readonly logger: BackendLogger,
  ) {
    this.file = path.join(dir, 'consumer-offsets.log');
  }

  open(): void {
    fs.rmSync(`${this.file}.tmp`, { force: true });
    let text = '';
    try {
      text = fs.readFileSync(this.file, 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    }
    let good = 0;
    let pos = 0;
    while (pos < text.length) {
      const nl = text.indexOf('\n', pos);
      if (nl < 0) break;
      try {
        const [g, t, p, o] = JSON.parse(text.slice(pos, nl)) as [string, string, number, number];
        this.set(g, t, p, o);
      } catch {
        break;
      }
      pos = nl + 1;
      good = pos;
    }
    const goodBytes = Buffer.byteLength(text.slice(0, good), 'utf8');
    const total = Buffer.byteLength(text, 'utf8');
    this.fd = fs.openSync(this.file, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o644);
    if (goodBytes < total) {
      this.logger.warn({ file: this.file, bytesDropped: total - goodBytes }, 'event log: dropping torn tail of the consumer offsets file');
      fs.ftruncateSync(this.fd, goodBytes);
    }
    this.size = goodBytes;
    if (this.size > REWRITE_BYTES) this.rewrite();
  }

  private set(group: string, topic: string, partition: number, offset: number): void {
    let byTopic = this.offsets.get(group);
    if (!byTopic) this.offsets.set(group, (byTopic = new Map()));
    let arr = byTopic.get(topic);
    if (!arr) byTopic.set(topic, (arr = []));
    while (arr.length <= partition) arr.push(-1);
    arr[partition] = offset;
  }

  get(group: string, topic: string, partition: number): number {
    return this.offsets.get(group)?.get(topic)?.[partition] ?? -1;
  }

  commit(group: string, topic: string, partition: number, offset: number): void {
    this.set(group, topic, partition, offset);
    const line = Buffer.from(`${JSON.stringify([group, topic, partition, offset])}\n`, 'utf8');
    let done = 0;
    while (done < line.length) done += fs.writeSync(this.fd, line, done, line.length - done, this.size + done);
    this.size += line.length;
    this.sync.markDirty(this);
    if (this.size > REWRITE_BYTES) this.maybeRewrite();
  }

  private rewriting = false;
  private maybeRewrite(): void {
    if (this.rewriting) return;
    this.rewriting = true;
    void this.sync
      .idle()
      .then(() => this.rewrite())
      .catch((err: unknown) => this.logger.warn({ err }, 'event log: rewriting the consumer offsets file failed'))
      .finally(() => {
        this.rewriting = false;
      });
  }

  /** Writes the current offsets as a fresh file. Call only while no fsync round is in flight. */
  private rewrite(): void {
    if (this.fd < 0) return;
    const lines: string[] = [];
    for (const [g, byTopic] of this.offsets) {
      for (const [t, arr] of byTopic) {
        arr.forEach((o, p) => {
          if (o >= 0) lines.push(JSON.stringify([g, t, p, o]));
        });
      }
    }
    const data = Buffer.from(lines.length ? `${lines.join('\n')}\n` : '', 'utf8');
    const tmp = `${this.file}.tmp`;
    const fd = fs.openSync(tmp, 'w');
    try {
      fs.writeSync(fd, data, 0, data.length, 0);
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, this.file);
    const dfd = fs.openSync(path.dirname(this.file), 'r');
    fs.fsyncSync(dfd);
    fs.closeSync(dfd);
    this.sync.forget(this);
    fs.closeSync(this.fd);
    this.fd = fs.openSync(this.file, 'r+');
    this.size = data.length;
  }

  close(): void {
    if (this.fd < 0) return;
    this.sync.forget(this);
    fs.fsyncSync(this.fd);
    fs.closeSync(this.fd);
    this.fd = -1;
  }
}
