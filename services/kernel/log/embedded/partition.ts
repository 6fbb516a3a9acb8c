/**
 * One partition of the embedded log: a folder of segment files named by their base offset
 * (`00000000000000000000.log`), the last one active. Closed segments get a sparse index file
 * (`<base>.index.json`) so opening does not rescan them; the active segment is rescanned and its
 * torn or corrupt tail truncated.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { BackendLogger, LogRecord } from '../event-log.ts';
import { checkFrame, decodeAt, encodeInto, encodedSize, peekKey, type EncodableRecord } from './record-format.ts';
import type { SyncScheduler } from './sync.ts';

/** A sparse index entry every this many bytes. */
const INDEX_INTERVAL = 16 * 1024;
const SCAN_CHUNK = 4 * 1024 * 1024;
const MAX_READ_CHUNK = 4 * 1024 * 1024;
/** Bytes of the newest records that the partitions of this process keep in memory for their readers (see `tail`), in all. */
const TAIL_BYTES = 64 * 1024 * 1024;
let tailBytesInAll = 0;
/**
 * What a kept record counts for: the memory its value holds on to (the whole buffer a view is of:
 * a small value cut from a large buffer keeps all of it alive), its key and its object (so
 * tombstones count too).
 */
const tailSize = (r: LogRecord): number => (r.value?.buffer.byteLength ?? 0) + (r.key?.length ?? 0) + 128;

/**
 * Where appends are encoded before their write(2): one buffer, grown as needed and reused, as the
 * write is synchronous. (A fresh buffer per append was V8 external memory, whose churn starts
 * full garbage collections of the whole heap; docs/performance.md, "Trace ingest".)
 */
let appendScratch = Buffer.allocUnsafe(1024 * 1024);

export interface Segment {
  base: number;
  file: string;
  fd: number;
  /** Bytes of valid records. */
  size: number;
  /** One past the last offset written in this segment (base when empty). */
  next: number;
  /** Newest record timestamp (-Infinity when empty). */
  maxTimestamp: number;
  idxOffsets: number[];
  idxPositions: number[];
  lastIndexedPos: number;
  records: number;
}

interface IndexFile {
  version: 1;
  base: number;
  size: number;
  next: number;
  maxTimestamp: number | null;
  records: number;
  offsets: number[];
  positions: number[];
}

/** A compacted copy of a closed segment, written beside it before it takes the segment's place. */
type Cleaned = Pick<Segment, 'file' | 'size' | 'records' | 'maxTimestamp' | 'idxOffsets' | 'idxPositions' | 'lastIndexedPos'>;

const segName = (base: number): string => String(base).padStart(20, '0');

/** Lets other work run between long synchronous steps (compaction reads whole segments). */
const yieldToLoop = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

function fsyncDir(dir: string): void {
  const fd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

function readFully(fd: number, buf: Buffer, length: number, position: number): number {
  let done = 0;
  while (done < length) {
    const n = fs.readSync(fd, buf, done, length - done, position + done);
    if (n === 0) break;
    done += n;
  }
  return done;
}

function writeFully(fd: number, buf: Buffer, length: number, position: number): void {
  let done = 0;
  while (done < length) {
    done += fs.writeSync(fd, buf, done, length - done, position + done);
  }
}

interface ScanResult {
  validSize: number;
  next: number;
  maxTimestamp: number;
  records: number;
  offsets: number[];
  positions: number[];
  problem: string | null;
}

/** Walks a segment file from the start, verifying every record, until the end or the first bad one. */
function scanSegment(fd: number, fileSize: number, base: number): ScanResult {
  const r: ScanResult = { validSize: 0, next: base, maxTimestamp: -Infinity, records: 0, offsets: [], positions: [], problem: null };
  let lastIndexed = -Infinity;
  let pos = 0;
  let chunk = Buffer.allocUnsafe(Math.min(SCAN_CHUNK, Math.max(fileSize, 1)));
  while (pos < fileSize) {
    const want = Math.min(chunk.length, fileSize - pos);
    const got = readFully(fd, chunk, want, pos);
    let p = 0;
    while (p < got) {
      const f = checkFrame(chunk, p, got);
      if (f.kind === 'ok') {
        if (f.offset < r.next) {
          r.problem = `offset ${f.offset} not after ${r.next - 1}`;
          r.validSize = pos + p;
          return r;
        }
        if (pos + p - lastIndexed >= INDEX_INTERVAL) {
          r.offsets.push(f.offset);
          r.positions.push(pos + p);
          lastIndexed = pos + p;
        }
        r.next = f.offset + 1;
        if (f.timestamp > r.maxTimestamp) r.maxTimestamp = f.timestamp;
        r.records++;
        p += f.size;
        continue;
      }
      if (f.kind === 'corrupt') {
        r.problem = f.reason;
        r.validSize = pos + p;
        return r;
      }
      // short: the record continues past this chunk
      break;
    }
    if (p === 0) {
      // A record bigger than the chunk, or a torn record at the end of the file.
      const need = got >= 8 ? 8 + chunk.readUInt32BE(4) : Infinity;
      if (pos + need > fileSize || got < 8) {
        r.problem = 'truncated record';
        r.validSize = pos;
        return r;
      }
      chunk = Buffer.allocUnsafe(need);
      continue;
    }
    pos += p;
    if (got < want) break;
  }
  r.validSize = pos;
  if (pos < fileSize && r.problem === null) r.problem = 'truncated record';
  return r;
}

export class Partition {
  readonly dir: string;
  segments: Segment[] = [];
  private waiters = new Set<() => void>();
  /**
   * The newest records of the active segment as they were appended, in offset order (a partition
   * that appends drops its oldest while the process's partitions hold more than TAIL_BYTES of
   * them, by tailSize): a reader that keeps up (the sink, the actors) is served from here, with no read, copy
   * or decode. Emptied when the segment rolls, so compaction and retention (which work on closed
   * segments only) never disagree with it. Values are shared, never to be changed.
   */
  private tail: LogRecord[] = [];
  private tailStart = 0;
  private tailBytes = 0;
  private compacting: Promise<void> | null = null;
  private compactQueued: Promise<void> | null = null;

  constructor(
    readonly topic: string,
    readonly partition: number,
    topicDir: string,
    private readonly sync: SyncScheduler,
    private readonly logger: BackendLogger,
  ) {
    this.dir = path.join(topicDir, String(partition));
  }

  get nextOffset(): number {
    return this.segments[this.segments.length - 1].next;
  }

  get startOffset(): number {
    for (const s of this.segments) if (s.records > 0) return s.idxOffsets[0] ?? s.base;
    return this.nextOffset;
  }

  private get active(): Segment {
    return this.segments[this.segments.length - 1];
  }

  open(): void {
    fs.mkdirSync(this.dir, { recursive: true });
    const names = fs.readdirSync(this.dir);
    for (const n of names) {
      if (n.endsWith('.cleaned') || n.endsWith('.tmp')) fs.rmSync(path.join(this.dir, n), { force: true });
    }
    const bases = names
      .filter((n) => /^\d{20}\.log$/.test(n))
      .map((n) => Number(n.slice(0, 20)))
      .sort((a, b) => a - b);
    for (let i = 0; i < bases.length; i++) {
      const last = i === bases.length - 1;
      this.segments.push(this.openSegment(bases[i], last));
    }
    if (this.segments.length === 0) this.segments.push(this.createSegment(0));
    // An empty active segment inherits nothing; its base is the next offset by construction.
  }

  private openSegment(base: number, last: boolean): Segment {
    const file = path.join(this.dir, `${segName(base)}.log`);
    const fd = fs.openSync(file, 'r+');
    const fileSize = fs.fstatSync(fd).size;
    const idxFile = path.join(this.dir, `${segName(base)}.index.json`);
    if (!last) {
      try {
        const idx = JSON.parse(fs.readFileSync(idxFile, 'utf8')) as IndexFile;
        if (idx.version === 1 && idx.base === base && idx.size === fileSize) {
          return {
            base,
            file,
            fd,
            size: idx.size,
            next: idx.next,
            maxTimestamp: idx.maxTimestamp ?? -Infinity,
            records: idx.records,
            idxOffsets: idx.offsets,
            idxPositions: idx.positions,
            lastIndexedPos: idx.positions.length ? idx.positions[idx.positions.length - 1] : -Infinity,
          };
        }
      } catch {
        // missing or stale: rescan
      }
    } else {
      fs.rmSync(idxFile, { force: true });
    }
    const scan = scanSegment(fd, fileSize, base);
    if (scan.problem !== null) {
      if (last) {
        this.logger.warn(
          {
            topic: this.topic,
            partition: this.partition,
            segment: file,
            reason: scan.problem,
            validBytes: scan.validSize,
            bytesDropped: fileSize - scan.validSize,
          },
          'event log: truncating torn or corrupt tail of the active segment',
        );
        fs.ftruncateSync(fd, scan.validSize);
        fs.fsyncSync(fd);
      } else {
        this.logger.warn(
          {
            topic: this.topic,
            partition: this.partition,
            segment: file,
            reason: scan.problem,
            validBytes: scan.validSize,
            unreadableBytes: fileSize - scan.validSize,
          },
          'event log: corrupt record in a closed segment; records after it are unreadable',
        );
      }
    }
    const seg: Segment = {
      base,
      file,
      fd,
      size: scan.validSize,
      next: scan.next,
      maxTimestamp: scan.maxTimestamp,
      records: scan.records,
      idxOffsets: scan.offsets,
      idxPositions: scan.positions,
      lastIndexedPos: scan.positions.length ? scan.positions[scan.positions.length - 1] : -Infinity,
    };
    if (!last && scan.problem === null) this.writeIndex(seg);
    return seg;
  }

  private createSegment(base: number): Segment {
    const file = path.join(this.dir, `${segName(base)}.log`);
    const fd = fs.openSync(file, fs.constants.O_RDWR | fs.constants.O_CREAT | fs.constants.O_EXCL, 0o644);
    fsyncDir(this.dir);
    return { base, file, fd, size: 0, next: base, maxTimestamp: -Infinity, records: 0, idxOffsets: [], idxPositions: [], lastIndexedPos: -Infinity };
  }

  private writeIndex(seg: Segment): void {
    const idx: IndexFile = {
      version: 1,
      base: seg.base,
      size: seg.size,
      next: seg.next,
      maxTimestamp: Number.isFinite(seg.maxTimestamp) ? seg.maxTimestamp : null,
      records: seg.records,
      offsets: seg.idxOffsets,
      positions: seg.idxPositions,
    };
    const target = path.join(this.dir, `${segName(seg.base)}.index.json`);
    fs.writeFileSync(`${target}.tmp`, JSON.stringify(idx));
    fs.renameSync(`${target}.tmp`, target);
  }

  /** Closes the active segment (fsynced, indexed) and starts a new one at the next offset. */
  roll(): boolean {
    const old = this.active;
    if (old.records === 0) return false;
    fs.fsyncSync(old.fd);
    this.sync.forget(old);
    this.writeIndex(old);
    this.dropTail();
    this.segments.push(this.createSegment(old.next));
    return true;
  }

  /**
   * Appends records (offsets are assigned here, in order) with one write(2). Rolls first when
   * the active segment would grow past `segmentBytes`. Returns whether it rolled.
   */
  append(records: Array<Omit<EncodableRecord, 'offset'>>, segmentBytes: number): { firstOffset: number; rolled: boolean } {
    let total = 0;
    const sizes = new Array<number>(records.length);
    for (let i = 0; i < records.length; i++) {
      sizes[i] = encodedSize(records[i] as EncodableRecord);
      total += sizes[i];
    }
    let rolled = false;
    if (this.active.size > 0 && this.active.size + total > segmentBytes) rolled = this.roll();
    const seg = this.active;
    const firstOffset = seg.next;
    if (appendScratch.length < total) appendScratch = Buffer.allocUnsafe(Math.max(total, appendScratch.length * 2));
    const buf = appendScratch;
    let p = 0;
    let offset = firstOffset;
    let maxTs = seg.maxTimestamp;
    const newIdxOffsets: number[] = [];
    const newIdxPositions: number[] = [];
    let lastIndexed = seg.lastIndexedPos;
    for (let i = 0; i < records.length; i++) {
      const r = records[i] as EncodableRecord;
      r.offset = offset;
      const filePos = seg.size + p;
      if (filePos - lastIndexed >= INDEX_INTERVAL) {
        newIdxOffsets.push(offset);
        newIdxPositions.push(filePos);
        lastIndexed = filePos;
      }
      p = encodeInto(buf, p, r);
      if (r.timestamp > maxTs) maxTs = r.timestamp;
      offset++;
    }
    try {
      writeFully(seg.fd, buf, total, seg.size);
    } catch (err) {
      try {
        fs.ftruncateSync(seg.fd, seg.size);
      } catch {
        // the scan on the next open truncates whatever is left
      }
      throw err;
    }
    seg.size += total;
    seg.next = offset;
    seg.records += records.length;
    seg.maxTimestamp = maxTs;
    for (let i = 0; i < newIdxOffsets.length; i++) {
      seg.idxOffsets.push(newIdxOffsets[i]);
      seg.idxPositions.push(newIdxPositions[i]);
    }
    seg.lastIndexedPos = lastIndexed;
    this.keepInTail(records as EncodableRecord[]);
    this.sync.markDirty(seg);
    this.notify();
    return { firstOffset, rolled };
  }

  private keepInTail(records: EncodableRecord[]): void {
    let bytes = 0;
    for (const r of records) {
      const kept: LogRecord = {
        topic: this.topic,
        partition: this.partition,
        offset: r.offset,
        key: r.key,
        value: r.value,
        headers: { ...r.headers },
        timestamp: r.timestamp,
      };
      this.tail.push(kept);
      bytes += tailSize(kept);
    }
    this.tailBytes += bytes;
    tailBytesInAll += bytes;
    // Drop the oldest past the budget (a run of them at once: shifting one by one is quadratic).
    let drop = this.tailStart;
    while (tailBytesInAll > TAIL_BYTES && drop < this.tail.length) {
      const size = tailSize(this.tail[drop++]!);
      this.tailBytes -= size;
      tailBytesInAll -= size;
    }
    this.tailStart = drop;
    if (drop === this.tail.length || drop > 1024 || drop > this.tail.length / 2) {
      this.tail = this.tail.slice(drop);
      this.tailStart = 0;
    }
  }

  private dropTail(): void {
    tailBytesInAll -= this.tailBytes;
    this.tail = [];
    this.tailStart = 0;
    this.tailBytes = 0;
  }

  /** Registers a one-shot callback for the next append. */
  onAppend(cb: () => void): () => void {
    this.waiters.add(cb);
    return () => this.waiters.delete(cb);
  }

  private notify(): void {
    if (this.waiters.size === 0) return;
    const ws = [...this.waiters];
    this.waiters.clear();
    for (const w of ws) w();
  }

  private findSegment(offset: number): number {
    let lo = 0;
    let hi = this.segments.length - 1;
    let ans = 0;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      if (this.segments[mid].base <= offset) {
        ans = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return ans;
  }

  private static positionFor(seg: Segment, offset: number): number {
    const offs = seg.idxOffsets;
    let lo = 0;
    let hi = offs.length - 1;
    let ans = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >>> 1;
      if (offs[mid] <= offset) {
        ans = mid;
        lo = mid + 1;
      } else hi = mid - 1;
    }
    return ans < 0 ? 0 : seg.idxPositions[ans];
  }

  read(fromOffset: number, max: number): LogRecord[] {
    const out: LogRecord[] = [];
    if (max <= 0 || fromOffset >= this.nextOffset) return out;
    const from = Math.max(0, fromOffset);
    const tailFirst = this.tail[this.tailStart]?.offset;
    if (tailFirst !== undefined && from >= tailFirst) {
      // Offsets in the tail are consecutive: the records of one segment, appended in order.
      const at = this.tailStart + (from - tailFirst);
      return this.tail.slice(at, at + max).map((r) => ({ ...r, headers: { ...r.headers } }));
    }
    for (let si = this.findSegment(from); si < this.segments.length && out.length < max; si++) {
      const seg = this.segments[si];
      if (seg.next <= from || seg.size === 0) continue;
      // Enough for the records wanted at the segment's mean record size, never more than is there:
      // a chunk smaller than the next record is read again at its size (a second, larger allocation).
      const start = Partition.positionFor(seg, from);
      const chunk = Math.min(MAX_READ_CHUNK, seg.size - start, Math.max(64 * 1024, (max - out.length) * Math.ceil(seg.size / seg.records)));
      this.scanFrames(seg, start, chunk, (buf, p, _size, offset) => {
        if (offset >= from) out.push(decodeAt(buf, p, this.topic, this.partition));
        return out.length < max;
      });
    }
    return out;
  }

  /** Iterates every record frame of a segment (for compaction). */
  private forEachFrame(seg: Segment, cb: (buf: Buffer, p: number, size: number, offset: number) => void): void {
    this.scanFrames(seg, 0, SCAN_CHUNK, (buf, p, size, offset) => {
      cb(buf, p, size, offset);
      return true;
    });
  }

  /**
   * Reads a segment's frames from byte `pos` in chunks, checking each; `visit` returns false to
   * stop. A frame larger than the chunk gets a chunk of its own size.
   */
  private scanFrames(seg: Segment, pos: number, chunkSize: number, visit: (buf: Buffer, p: number, size: number, offset: number) => boolean): void {
    while (pos < seg.size) {
      const len = Math.min(seg.size - pos, chunkSize);
      const buf = Buffer.allocUnsafe(len);
      const got = readFully(seg.fd, buf, len, pos);
      let p = 0;
      while (p < got) {
        const f = checkFrame(buf, p, got);
        if (f.kind === 'short') break;
        if (f.kind === 'corrupt') throw new Error(`event log: corrupt record in ${seg.file} at byte ${pos + p}: ${f.reason}`);
        const more = visit(buf, p, f.size, f.offset);
        p += f.size;
        if (!more) return;
      }
      if (p === 0) {
        if (got < 8) throw new Error(`event log: short read in ${seg.file} at byte ${pos}`);
        chunkSize = 8 + buf.readUInt32BE(4);
        continue;
      }
      pos += p;
    }
  }

  /**
   * Rewrites the closed segments keeping, for each key, only its last record; tombstones that
   * are a key's last record are dropped too. Offsets are preserved (so they become sparse).
   * Records with a null key are kept.
   */
  compact(): Promise<void> {
    // A compaction in flight may have started before the latest roll: queue one more after it.
    if (this.compactQueued) return this.compactQueued;
    if (!this.compacting) return this.startCompaction();
    this.compactQueued = this.compacting
      .catch(() => undefined)
      .then(() => {
        this.compactQueued = null;
        return this.startCompaction();
      });
    return this.compactQueued;
  }

  private startCompaction(): Promise<void> {
    if (this.segments.length === 0) return Promise.resolve();
    const run: Promise<void> = this.doCompact().finally(() => {
      if (this.compacting === run) this.compacting = null;
    });
    this.compacting = run;
    return run;
  }

  private async doCompact(): Promise<void> {
    const closed = this.segments.slice(0, -1);
    if (closed.length === 0) return;
    const last = await this.lastOffsetPerKey();
    let bytesBefore = 0;
    let bytesAfter = 0;
    for (const seg of closed) {
      if (!this.segments.includes(seg)) continue; // removed meanwhile (retention)
      const cleaned = this.writeCleaned(seg, last);
      bytesBefore += seg.size;
      bytesAfter += cleaned.size;
      await this.installCleaned(seg, cleaned);
    }
    // Drop closed segments left empty (never the active one).
    for (const seg of this.segments.slice(0, -1)) {
      if (seg.records === 0) await this.removeSegment(seg);
    }
    this.logger.info({ topic: this.topic, partition: this.partition, bytesBefore, bytesAfter }, 'event log: compacted');
  }

  /** Last offset per key over the whole partition, active segment included. */
  private async lastOffsetPerKey(): Promise<Map<string, number>> {
    const last = new Map<string, number>();
    for (const seg of this.segments) {
      this.forEachFrame(seg, (buf, p, _size, offset) => {
        const { key } = peekKey(buf, p);
        if (key !== null) last.set(key, offset);
      });
      await yieldToLoop();
    }
    return last;
  }

  /**
   * Writes `<segment>.cleaned`: the segment's records that are their key's last and not a
   * tombstone (null-key records too), indexed afresh, then fsyncs it.
   */
  private writeCleaned(seg: Segment, last: Map<string, number>): Cleaned {
    const cleaned: Cleaned = {
      file: `${seg.file}.cleaned`,
      size: 0,
      records: 0,
      maxTimestamp: -Infinity,
      idxOffsets: [],
      idxPositions: [],
      lastIndexedPos: -Infinity,
    };
    const out = fs.openSync(cleaned.file, 'w');
    let pending: Buffer[] = [];
    let pendingBytes = 0;
    const flush = (): void => {
      if (pendingBytes === 0) return;
      const b = Buffer.concat(pending, pendingBytes);
      writeFully(out, b, b.length, cleaned.size - pendingBytes);
      pending = [];
      pendingBytes = 0;
    };
    try {
      this.forEachFrame(seg, (buf, p, size, offset) => {
        const { key, tombstone } = peekKey(buf, p);
        if (key !== null && (last.get(key) !== offset || tombstone)) return;
        if (cleaned.size - cleaned.lastIndexedPos >= INDEX_INTERVAL) {
          cleaned.idxOffsets.push(offset);
          cleaned.idxPositions.push(cleaned.size);
          cleaned.lastIndexedPos = cleaned.size;
        }
        const ts = buf.readDoubleBE(p + 16);
        if (ts > cleaned.maxTimestamp) cleaned.maxTimestamp = ts;
        pending.push(buf.subarray(p, p + size));
        pendingBytes += size;
        cleaned.size += size;
        cleaned.records++;
        if (pendingBytes >= 1024 * 1024) flush();
      });
      flush();
      fs.fsyncSync(out);
    } finally {
      fs.closeSync(out);
    }
    return cleaned;
  }

  /**
   * Puts a cleaned copy in place of its segment once no fsync of it is in flight: rename over it,
   * fsync the folder, then swap the fd and rewrite the index. A copy that dropped nothing, or
   * whose segment went meanwhile (retention), is deleted instead.
   */
  private async installCleaned(seg: Segment, cleaned: Cleaned): Promise<void> {
    if (cleaned.size === seg.size) {
      fs.rmSync(cleaned.file, { force: true });
      return;
    }
    await this.sync.idle();
    if (!this.segments.includes(seg)) {
      fs.rmSync(cleaned.file, { force: true });
      return;
    }
    fs.renameSync(cleaned.file, seg.file);
    fsyncDir(this.dir);
    const newFd = fs.openSync(seg.file, 'r+');
    fs.closeSync(seg.fd);
    seg.fd = newFd;
    seg.size = cleaned.size;
    seg.records = cleaned.records;
    seg.maxTimestamp = cleaned.maxTimestamp;
    seg.idxOffsets = cleaned.idxOffsets;
    seg.idxPositions = cleaned.idxPositions;
    seg.lastIndexedPos = cleaned.lastIndexedPos;
    // seg.next stays: offsets after the last kept record up to `next` are simply gone.
    this.writeIndex(seg);
    await yieldToLoop();
  }

  /** Deletes closed segments, oldest first, whose newest record is older than `cutoff`. */
  async applyRetention(cutoff: number): Promise<number> {
    let removed = 0;
    while (this.segments.length > 1) {
      const seg = this.segments[0];
      if (seg.records > 0 && seg.maxTimestamp >= cutoff) break;
      await this.removeSegment(seg);
      removed++;
    }
    if (removed > 0) this.logger.info({ topic: this.topic, partition: this.partition, segments: removed }, 'event log: retention removed segments');
    return removed;
  }

  private async removeSegment(seg: Segment): Promise<void> {
    await this.sync.idle();
    const i = this.segments.indexOf(seg);
    if (i < 0 || i === this.segments.length - 1) return;
    this.segments.splice(i, 1);
    this.sync.forget(seg);
    fs.closeSync(seg.fd);
    fs.rmSync(seg.file, { force: true });
    fs.rmSync(path.join(this.dir, `${segName(seg.base)}.index.json`), { force: true });
  }

  /** Waits for a compaction in flight (close). */
  async settle(): Promise<void> {
    if (this.compactQueued) await this.compactQueued.catch(() => undefined);
    if (this.compacting) await this.compacting.catch(() => undefined);
  }

  close(): void {
    const active = this.segments[this.segments.length - 1];
    for (const seg of this.segments) {
      this.sync.forget(seg);
      try {
        if (seg === active) fs.fsyncSync(seg.fd);
      } finally {
        fs.closeSync(seg.fd);
      }
    }
    this.segments = [];
    this.dropTail();
    this.notify();
  }
}
