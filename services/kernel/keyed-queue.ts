/**
 * Per-key ordering inside one process: `run` starts a task after every earlier task of the same
 * key has finished, so a read-modify-write of one entity (the next version of a spec or an agent)
 * never interleaves with another of the same key. A failed task does not stop the ones after it.
 */
export class KeyedQueue {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, task: () => Promise<T>): Promise<T> {
    const result = (this.tails.get(key) ?? Promise.resolve()).then(task, task);
    const tail = result.catch(() => {});
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return result;
  }

  /** Resolves once every task queued so far, of every key, has finished (a stop awaits it). */
  async settled(): Promise<void> {
    await Promise.all(this.tails.values());
  }
}
