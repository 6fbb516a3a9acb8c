/**
 * The dashboard (docs/dashboard.md): a key form until the tenant key is entered (kept in
 * sessionStorage), then the pages by hash route. Everything it shows comes from the public API.
 */
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { clientFor, errorText, forgetKey, storedKey, storeKey, SvcError } from './api.ts';
import { Compare } from './pages/compare.tsx';
import { Alerts, DatasetRecords, Datasets } from './pages/datasets.tsx';
import { Experiment } from './pages/experiment.tsx';
import { Overview } from './pages/overview.tsx';
import { SandboxLive, Sandboxes } from './pages/sandboxes.tsx';
import { Trace, Traces } from './pages/trace.tsx';
import { href, useRoute, type Route } from './router.ts';
import './styles.css';

function KeyForm({ onKey, notice }: { onKey: (key: string) => void; notice: string | null }) {
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  return (
    <form
      class="key-form"
      onSubmit={async (e) => {
        e.preventDefault();
        const key = (e.currentTarget.elements.namedItem('key') as HTMLInputElement).value.trim();
        if (!key) return setError('Enter your API key.');
        setBusy(true);
        try {
          await clientFor(key).specs.list();
          storeKey(key);
          onKey(key);
        } catch (err) {
          setError(err instanceof SvcError && err.status === 401 ? 'The service refused this key.' : errorText(err));
        } finally {
          setBusy(false);
        }
      }}
    >
      <h1>svc dashboard</h1>
      {notice && <p class="error">{notice}</p>}
      <label>
        API key
        <input name="key" type="password" autocomplete="off" placeholder="svc_live_…" autofocus />
      </label>
      <p class="muted">Kept in this tab's session storage only, and sent as a Bearer header to this service.</p>
      <button type="submit" disabled={busy}>
        {busy ? 'Checking…' : 'Open'}
      </button>
      {error && (
        <p class="error" role="alert">
          {error}
        </p>
      )}
    </form>
  );
}

function Page({ route }: { route: Route }) {
  const [first, second, third] = route.parts;
  if (first === 'experiments' && second) return <Experiment id={second} />;
  if (first === 'compare' && second && third) return <Compare baseline={second} candidate={third} />;
  if (first === 'traces' && second) return <Trace id={second} />;
  if (first === 'traces') return <Traces query={route.query} />;
  if (first === 'sandboxes' && second) return <SandboxLive id={second} />;
  if (first === 'sandboxes') return <Sandboxes />;
  if (first === 'datasets' && second) return <DatasetRecords id={second} />;
  if (first === 'datasets') return <Datasets />;
  if (first === 'alerts') return <Alerts />;
  return <Overview />;
}

const NAV: Array<[string, string]> = [
  ['', 'Experiments'],
  ['sandboxes', 'Sandboxes'],
  ['traces', 'Traces'],
  ['datasets', 'Datasets'],
  ['alerts', 'Alerts'],
];

function App() {
  const [key, setKey] = useState(storedKey());
  const [notice, setNotice] = useState<string | null>(null);
  const route = useRoute();
  useEffect(() => {
    const onUnauthorized = () => {
      setNotice('The key stopped working (revoked or rotated?): enter one again.');
      setKey(null);
    };
    window.addEventListener('svc:unauthorized', onUnauthorized);
    return () => window.removeEventListener('svc:unauthorized', onUnauthorized);
  }, []);
  if (!key) return <KeyForm onKey={setKey} notice={notice} />;
  return (
    <>
      <header>
        <a class="brand" href={href('')}>
          svc
        </a>
        <nav>
          {NAV.map(([path, label]) => (
            <a
              href={href(...(path ? [path] : []))}
              class={(route.parts[0] ?? '') === path || (path === '' && route.parts[0] === 'experiments') ? 'active' : ''}
            >
              {label}
            </a>
          ))}
        </nav>
        <button
          type="button"
          class="link sign-out"
          onClick={() => {
            forgetKey();
            setNotice(null);
            setKey(null);
          }}
        >
          Forget key
        </button>
      </header>
      <main>
        <Page route={route} />
      </main>
    </>
  );
}

render(<App />, document.getElementById('app')!);
