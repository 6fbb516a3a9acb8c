/**
 * Live sandboxes, and one sandbox followed live: its event stream (SSE, read with the Bearer
 * key over fetch) as boot steps, commands and audit records, plus a box to run a command in it.
 */
import { useEffect, useState } from 'preact/hooks';
import type { SandboxEvent } from '../../../sdk/src/client.ts';
import { api, errorText, isUnauthorized, reportUnauthorized } from '../api.ts';
import { useLoad } from '../hooks.ts';
import { href } from '../router.ts';
import { ErrorBox, Loading, Section, Status, when } from '../ui.tsx';

const BOOT_STEPS = [
  'secrets_resolved',
  'container_started',
  'services_started',
  'fixtures_applied',
  'setup_applied',
  'network_configured',
  'audit_started',
  'snapshot_taken',
  'ready',
];

export function Sandboxes() {
  const { data, error, loading } = useLoad(() => api().sandboxes.list(), [], { pollMs: 3000, keepPolling: () => true });
  if (loading && !data) return <Loading />;
  return (
    <Section title="Live sandboxes">
      <ErrorBox error={error} />
      {data && data.length === 0 && <p class="muted">No live sandbox. `svc sandboxes create SPEC` makes one.</p>}
      <table class="list">
        <tbody>
          {(data ?? []).map((s) => (
            <tr>
              <td>
                <a href={href('sandboxes', s.id)}>{s.id}</a>
              </td>
              <td>{s.spec_id}</td>
              <td>
                <Status value={s.state} />
              </td>
              <td>{when(s.created_at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </Section>
  );
}

/** The stream's events as they arrive; `ended` once it closes (after `destroyed`). */
function useSandboxStream(id: string) {
  const [events, setEvents] = useState<SandboxEvent[]>([]);
  const [ended, setEnded] = useState(false);
  const [error, setError] = useState<unknown>(null);
  useEffect(() => {
    const abort = new AbortController();
    setEvents([]);
    setEnded(false);
    (async () => {
      try {
        for await (const e of api().sandboxes.events(id, { signal: abort.signal })) setEvents((list) => [...list, e]);
        setEnded(true);
      } catch (err) {
        if (abort.signal.aborted) return;
        if (isUnauthorized(err)) reportUnauthorized();
        setError(err);
      }
    })();
    return () => abort.abort();
  }, [id]);
  return { events, ended, error };
}

function eventText(e: SandboxEvent): string {
  const d = e.data;
  if (e.event_type === 'command') return `${String(d.command)} → exit ${String(d.exit_code)} (${String(d.duration_ms)} ms)`;
  if (e.event_type === 'audit') return `${String(d.type)} ${JSON.stringify(d.details ?? {})}`;
  if (e.event_type === 'status')
    return `${String(d.step ?? d.state)} ${JSON.stringify(Object.fromEntries(Object.entries(d).filter(([k]) => k !== 'step' && k !== 'state')))}`;
  return JSON.stringify(d);
}

function CommandBox({ id }: { id: string }) {
  const [output, setOutput] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  return (
    <form
      class="command-box"
      onSubmit={async (e) => {
        e.preventDefault();
        const input = e.currentTarget.elements.namedItem('command') as HTMLInputElement;
        if (!input.value.trim()) return;
        setBusy(true);
        try {
          const r = await api().sandboxes.command(id, input.value);
          setOutput(`$ ${input.value}\n${r.stdout}${r.stderr}(exit ${r.exit_code})`);
        } catch (err) {
          setOutput(errorText(err));
        } finally {
          setBusy(false);
        }
      }}
    >
      <input name="command" placeholder="run a command in /workspace, e.g. ls -la" disabled={busy} />
      <button type="submit" disabled={busy}>
        {busy ? 'Running…' : 'Run'}
      </button>
      {output !== null && <pre class="command-output">{output}</pre>}
    </form>
  );
}

export function SandboxLive({ id }: { id: string }) {
  const info = useLoad(() => api().sandboxes.get(id), [id], { pollMs: 2000, keepPolling: (s) => s.state !== 'stopped' && s.state !== 'error' });
  const { events, ended, error } = useSandboxStream(id);
  const steps = new Map(events.filter((e) => e.event_type === 'status' && e.data.step).map((e) => [String(e.data.step), e]));
  const destroyed = events.find((e) => e.event_type === 'status' && e.data.state === 'destroyed');
  const commands = events.filter((e) => e.event_type === 'command');
  const audit = events.filter((e) => e.event_type === 'audit');
  const others = events.filter((e) => !['status', 'command', 'audit'].includes(e.event_type));
  const live = info.data && info.data.state !== 'stopped' && info.data.state !== 'error' && !destroyed;
  return (
    <div class="sandbox" data-sandbox={id} data-stream={ended ? 'ended' : 'open'}>
      <h1>
        Sandbox <span class="mono">{id}</span> {info.data && <Status value={destroyed ? 'stopped' : info.data.state} />}
      </h1>
      {info.data && (
        <p class="muted">
          spec {info.data.spec_id} · created {when(info.data.created_at)}
          {info.data.expires_at ? ` · expires ${when(info.data.expires_at)}` : ''} · <a href={`${href('traces')}?sandbox=${encodeURIComponent(id)}`}>traces</a>
        </p>
      )}
      <ErrorBox error={error ?? (info.data ? null : info.error)} />
      <p class="stream-state">
        {ended
          ? `Stream closed${destroyed ? `: destroyed${destroyed.data.reason ? ` (${String(destroyed.data.reason)})` : ''}` : ''}`
          : 'Following the live stream…'}
      </p>
      <div class="columns">
        <Section title="Boot">
          <ol class="steps">
            {BOOT_STEPS.map((step) => (
              <li class={steps.has(step) ? 'done' : ''} data-step={step}>
                {steps.has(step) ? '✓' : '·'} {step} {steps.has(step) && <span class="muted">{eventText(steps.get(step)!).slice(step.length)}</span>}
              </li>
            ))}
          </ol>
          {others.length > 0 && (
            <ul class="events other">
              {others.map((e) => (
                <li>
                  <strong>{e.event_type}</strong> {eventText(e)}
                </li>
              ))}
            </ul>
          )}
        </Section>
        <Section title={`Commands (${commands.length})`}>
          {live && <CommandBox id={id} />}
          <ul class="events commands">
            {commands.map((e) => (
              <li>
                <code>{eventText(e)}</code>
              </li>
            ))}
          </ul>
        </Section>
      </div>
      <Section title={`Audit (${audit.length})`}>
        <ul class="events audit-list">
          {audit.map((e) => (
            <li>
              <span class="muted">{when((e.data as { ts?: string }).ts)}</span> <code>{eventText(e)}</code>
            </li>
          ))}
        </ul>
      </Section>
    </div>
  );
}
