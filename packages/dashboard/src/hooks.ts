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
  const [state, setState] = useState<{ data: T | null; error: unknown; loading: boolean }>({ data: null, error: null, loading: true });
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
        setState({ data, error: null, loading: false });
        if (options.pollMs && options.keepPolling?.(data)) timer = setTimeout(run, options.pollMs);
      } catch (error) {
        if (!alive.current) return;
        if (isUnauthorized(error)) reportUnauthorized();
        setState((s) => ({ data: s.data, error, loading: false }));
      }
    };
    void run();
    return () => {
      alive.current = false;
      if (timer) clearTimeout(timer);
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [...deps, tick]);
  return { ...state, reload };
}
