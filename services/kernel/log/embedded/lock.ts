/** Exclusive ownership of a data dir: a `LOCK` file holding the owner's pid. */
import * as fs from 'node:fs';
import * as path from 'node:path';

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

export class DirLock {
  private held = false;
  readonly file: string;

  constructor(dir: string) {
    this.file = path.join(dir, 'LOCK');
  }

  /** Takes the lock, taking over a stale one; throws "data dir is in use by pid N" otherwise. */
  acquire(): { tookOverFrom: number | null } {
    for (let attempt = 0; attempt < 5; attempt++) {
      if (this.acquireFresh()) return { tookOverFrom: null };
      let content = '';
      try {
        content = fs.readFileSync(this.file, 'utf8');
      } catch {
        continue; // removed meanwhile: retry
      }
      const pid = Number.parseInt(content.trim(), 10);
      if (Number.isInteger(pid) && pid > 0 && alive(pid)) {
        throw new Error(`data dir is in use by pid ${pid} (${this.file})`);
      }
      // Stale (owner gone, or a torn write of the pid): take it over.
      const stale = `${this.file}.stale-${process.pid}`;
      try {
        fs.renameSync(this.file, stale);
        fs.rmSync(stale, { force: true });
      } catch {
        // another process took it over first; retry
      }
      const result = this.acquireFresh();
      if (result) return { tookOverFrom: Number.isInteger(pid) ? pid : null };
    }
    throw new Error(`could not take the data dir lock ${this.file}`);
  }

  private acquireFresh(): boolean {
    try {
      const fd = fs.openSync(this.file, 'wx', 0o644);
      try {
        fs.writeSync(fd, `${process.pid}\n`);
        fs.fsyncSync(fd);
      } finally {
        fs.closeSync(fd);
      }
      this.held = true;
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
      throw err;
    }
  }

  release(): void {
    if (!this.held) return;
    this.held = false;
    try {
      if (fs.readFileSync(this.file, 'utf8').trim() === String(process.pid)) fs.rmSync(this.file, { force: true });
    } catch {
      // already gone
    }
  }
}
