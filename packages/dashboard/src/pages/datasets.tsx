/** Datasets and their records (by version), and alert rules with their firings. */
import { useState } from 'preact/hooks';
import { api } from '../api.ts';
import { useLoad } from '../hooks.ts';
import { href } from '../router.ts';
import { ErrorBox, Loading, Section, when } from '../ui.tsx';

const cell = (v: unknown) => (v === null || v === undefined ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v));

export function Datasets() {
  const { data, error, loading } = useLoad(() => api().datasets.list({ limit: 1000 }), []);
  if (loading && !data) return <Loading />;
  return (
    <Section title="Datasets">
      <ErrorBox error={error} />
      {data && data.items.length === 0 && <p class="muted">No dataset yet.</p>}
      <table class="list">
        <tbody>
          {(data?.items ?? []).map((d) => (
            <tr>
              <td>
                <a href={href('datasets', d.id)}>{d.name}</a> <span class="mono muted">{d.id}</span>
              </td>
              <td>version {d.version}</td>
              <td>{cell(d.description)}</td>
              <td>{when(d.created_at)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </Section>
  );
}

export function DatasetRecords({ id }: { id: string }) {
  const [version, setVersion] = useState<number | undefined>(undefined);
  const dataset = useLoad(() => api().datasets.get(id), [id]);
  const records = useLoad(() => api().datasets.records(id, { limit: 1000, ...(version !== undefined && { version }) }), [id, version]);
  const latest = dataset.data?.version ?? 1;
  return (
    <div>
      <h1>
        Dataset {dataset.data?.name ?? id} <span class="mono muted">{id}</span>
      </h1>
      <ErrorBox error={dataset.error ?? records.error} />
      <label>
        Version{' '}
        <select value={version ?? latest} onChange={(e) => setVersion(Number((e.currentTarget as HTMLSelectElement).value))}>
          {Array.from({ length: latest }, (_, i) => latest - i).map((v) => (
            <option value={v}>{v}</option>
          ))}
        </select>
      </label>
      {records.loading && !records.data ? (
        <Loading />
      ) : (
        <table class="list">
          <thead>
            <tr>
              <th>record</th>
              <th>version</th>
              <th>input</th>
              <th>expected</th>
              <th>tags</th>
            </tr>
          </thead>
          <tbody>
            {(records.data?.items ?? []).map((r) => (
              <tr>
                <td class="mono">{cell(r.id)}</td>
                <td>{cell(r.version)}</td>
                <td class="message">{cell(r.input)}</td>
                <td class="message">{cell(r.expected)}</td>
                <td>{cell(r.tags)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  );
}

export function Alerts() {
  const rules = useLoad(() => api().alerts.list(), []);
  const firings = useLoad(() => api().alerts.firings({ limit: 200 }), []);
  return (
    <div>
      <Section title="Alert rules">
        <ErrorBox error={rules.error} />
        {rules.data && rules.data.length === 0 && <p class="muted">No alert rule.</p>}
        <table class="list">
          <tbody>
            {(rules.data ?? []).map((r) => (
              <tr>
                <td>{cell(r.name)}</td>
                <td class="mono">{cell(r.condition)}</td>
                <td>{cell(r.window)}</td>
                <td>{r.eval_id ? `spec ${cell(r.eval_id)}` : 'all specs'}</td>
                <td>{cell(r.notify)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
      <Section title="Firings">
        <ErrorBox error={firings.error} />
        {firings.data && firings.data.items.length === 0 && <p class="muted">Nothing fired.</p>}
        <table class="list">
          <tbody>
            {(firings.data?.items ?? []).map((f) => (
              <tr>
                <td>{when(f.fired_at)}</td>
                <td>{cell(f.rule_name ?? f.rule_id)}</td>
                <td>{f.experiment_id ? <a href={href('experiments', String(f.experiment_id))}>{cell(f.experiment_id)}</a> : ''}</td>
                <td>
                  {cell(f.metric_value)} vs {cell(f.threshold)}
                </td>
                <td>{cell(f.status)}</td>
                <td class="message">{cell(f.reason)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      </Section>
    </div>
  );
}
