/** Loading data: once, or polling while a condition holds (an experiment still running). */
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import { isUnauthorized, reportUnauthorized } from './api.ts';

export interface Loaded<T> {
  data: T | null;
  error: unknown;
  loading: boolean;
  reload: () => void;
}

/** Calls `load` when `deps` change, and every `pollMs` while `keepPolling(data)` is true. */
export function useLoad<T>(load: () => Promise<T>, deps: unknown[], options: { pollMs?: number; keepPolling?: (data: T) => boolean } = {}): Loaded<T> {
  // What was loaded is kept with the deps it was loaded for: a page that moves to another id
  // (another experiment) shows nothing of the previous one while the new one loads.
  const key = JSON.stringify(deps);
  const [state, setState] = useState<{ key: string; data: T | null; error: unknown; loading: boolean }>({ key, data: null, error: null, loading: true });
  const [tick, setTick] = useState(0);
  const alive = useRef(true);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  useEffect(() => {
    alive.current = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = async () => {
      try {
        const data = await load();
        if (!alive.current) return;
        setState({ key, data, error: null, loading: false });
        if (options.pollMs && options.keepPolling?.(data)) timer = setTimeout(run, options.pollMs);
      } catch (error) {
        if (!alive.current) return;
        if (isUnauthorized(error)) reportUnauthorized();
        setState((s) => ({ key, data: s.key === key ? s.data : null, error, loading: false }));
      }
    };
    void run();
    return () => {
      alive.current = false;
      if (timer) clearTimeout(timer);
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [key, tick]);
  const { key: loadedFor, ...loaded } = state;
  return { ...(loadedFor === key ? loaded : { data: null, error: null, loading: true }), reload };
}
