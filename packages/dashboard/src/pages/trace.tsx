/**
 * Traces: a sandbox's (or an experiment's, or an agent's) traces found from their events, and one
 * trace as a tree of spans beside a waterfall of their times; a span opens to its input, output,
 * cost and metadata.
 */
import { useState } from 'preact/hooks';
import type { SpanRecord, StoredTraceEvent } from '../../../sdk/src/client.ts';
import { api } from '../api.ts';
import { useLoad } from '../hooks.ts';
import { href } from '../router.ts';
import { ErrorBox, Loading, ms, Section, when } from '../ui.tsx';

function allSpans(traceId: string): Promise<SpanRecord[]> {
  return api().traces.allSpans(traceId, 10_000);
}

interface Row {
  span: SpanRecord;
  depth: number;
}

/** Depth-first order: each span under its parent, siblings by start. */
export function treeRows(spans: SpanRecord[]): Row[] {
  const ids = new Set(spans.map((s) => s.span_id));
  const children = new Map<string | null, SpanRecord[]>();
  for (const s of spans) {
    const parent = s.parent_span_id && ids.has(s.parent_span_id) && s.parent_span_id !== s.span_id ? s.parent_span_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent)!.push(s);
  }
  const rows: Row[] = [];
  const seen = new Set<string>();
  const walk = (parent: string | null, depth: number) => {
    for (const s of (children.get(parent) ?? []).sort((a, b) => (a.start < b.start ? -1 : 1))) {
      if (seen.has(s.span_id)) continue;
      seen.add(s.span_id);
      rows.push({ span: s, depth });
      walk(s.span_id, depth + 1);
    }
  };
  walk(null, 0);
  return rows;
}

const time = (iso: string | null) => (iso ? Date.parse(iso) : NaN);

function Waterfall({ spans }: { spans: SpanRecord[] }) {
  const [selected, setSelected] = useState<string | null>(null);
  const rows = treeRows(spans);
  const start = Math.min(...spans.map((s) => time(s.start)));
  const end = Math.max(...spans.map((s) => (s.end ? time(s.end) : time(s.start) + (s.duration_ms ?? 0))));
  const total = Math.max(1, end - start);
  const chosen = spans.find((s) => s.span_id === selected);
  return (
    <div class="trace">
      <table class="list waterfall">
        <thead>
          <tr>
            <th>span</th>
            <th>status</th>
            <th>duration</th>
            <th class="bar-col">timeline ({ms(total)})</th>
          </tr>
        </thead>
        <tbody>
          {rows.map(({ span, depth }) => {
            const left = ((time(span.start) - start) / total) * 100;
            const width = Math.max(0.5, (((span.end ? time(span.end) : time(span.start) + (span.duration_ms ?? 0)) - time(span.start)) / total) * 100);
            return (
              <tr
                class={`span ${span.status === 'error' ? 'failed' : ''} ${selected === span.span_id ? 'selected' : ''}`}
                data-span={span.span_id}
                data-depth={depth}
                onClick={() => setSelected(selected === span.span_id ? null : span.span_id)}
              >
                <td class="span-name" style={{ paddingLeft: `${0.5 + depth * 1.25}rem` }}>
                  {depth > 0 ? '└ ' : ''}
                  <strong>{span.tool}</strong> <span class="muted">{span.event_type}</span>
                </td>
                <td>{span.status}</td>
                <td>{ms(span.duration_ms)}</td>
                <td class="bar-col">
                  <div class="bar-track">
                    <div class={`bar e-${span.event_type}`} style={{ left: `${left.toFixed(2)}%`, width: `${Math.min(100 - left, width).toFixed(2)}%` }} />
                  </div>
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {chosen && (
        <div class="span-detail">
          <h4>
            {chosen.tool} <span class="mono muted">{chosen.span_id}</span>
          </h4>
          <p class="muted">
            {when(chosen.start)} → {when(chosen.end)} · parent {chosen.parent_span_id ?? '(root)'}
          </p>
          {chosen.input !== undefined && (
            <>
              <h5>input</h5>
              <pre>{String(chosen.input)}</pre>
            </>
          )}
          {chosen.output !== undefined && (
            <>
              <h5>output</h5>
              <pre>{String(chosen.output)}</pre>
            </>
          )}
          {chosen.cost !== undefined && (
            <>
              <h5>cost</h5>
              <pre>{JSON.stringify(chosen.cost, null, 2)}</pre>
            </>
          )}
          {chosen.metadata !== undefined && (
            <>
              <h5>metadata</h5>
              <pre>{JSON.stringify(chosen.metadata, null, 2)}</pre>
            </>
          )}
        </div>
      )}
    </div>
  );
}

export function Trace({ id }: { id: string }) {
  const { data, error, loading } = useLoad(() => allSpans(id), [id]);
  if (loading && !data) return <Loading />;
  if (!data) return <ErrorBox error={error} />;
  return (
    <div data-trace={id}>
      <h1>
        Trace <span class="mono">{id}</span>
      </h1>
      <p class="muted">{data.length} spans</p>
      <Waterfall spans={data} />
    </div>
  );
}

/** The traces that events matching the filters belong to, each with its first event. */
async function findTraces(filters: Record<string, string>) {
  const client = api();
  const events: StoredTraceEvent[] = [];
  let cursor: string | undefined;
  do {
    const page = await client.traces.list({ ...filters, limit: 1000, ...(cursor && { cursor }) });
    events.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && events.length < 5000);
  const byTrace = new Map<string, { first: StoredTraceEvent; count: number }>();
  for (const e of events) {
    const t = String(e.trace_id);
    const entry = byTrace.get(t);
    if (entry) entry.count += 1;
    else byTrace.set(t, { first: e, count: 1 });
  }
  return [...byTrace.entries()];
}

export function Traces({ query }: { query: URLSearchParams }) {
  const filters: Record<string, string> = {};
  for (const [param, filter] of [
    ['sandbox', 'sandbox_id'],
    ['experiment', 'experiment_id'],
    ['agent', 'agent'],
  ] as const) {
    const v = query.get(param);
    if (v) filters[filter] = v;
  }
  const key = JSON.stringify(filters);
  const { data, error, loading } = useLoad(() => (Object.keys(filters).length ? findTraces(filters) : Promise.resolve([])), [key]);
  return (
    <div>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          const form = e.currentTarget.elements;
          const trace = (form.namedItem('trace') as HTMLInputElement).value.trim();
          if (trace) return void (window.location.hash = href('traces', trace).slice(1));
          const q = new URLSearchParams();
          for (const name of ['sandbox', 'experiment', 'agent']) {
            const v = (form.namedItem(name) as HTMLInputElement).value.trim();
            if (v) q.set(name, v);
          }
          window.location.hash = `/traces?${q}`;
        }}
      >
        <input name="trace" placeholder="trace id" />
        <input name="sandbox" placeholder="sandbox sb-…" value={query.get('sandbox') ?? ''} />
        <input name="experiment" placeholder="experiment exp-…" value={query.get('experiment') ?? ''} />
        <input name="agent" placeholder="agent name" value={query.get('agent') ?? ''} />
        <button type="submit">Find</button>
      </form>
      <ErrorBox error={error} />
      {loading && <Loading />}
      {data && Object.keys(filters).length > 0 && (
        <Section title={`Traces (${data.length})`}>
          {data.length === 0 && <p class="muted">No trace events match.</p>}
          <table class="list">
            <tbody>
              {data.map(([traceId, { first, count }]) => (
                <tr>
                  <td>
                    <a href={href('traces', traceId)}>{traceId}</a>
                  </td>
                  <td>{first.tool}</td>
                  <td>{count} events</td>
                  <td>{when(first.ts)}</td>
                </tr>
              ))}
            </tbody>
          </table>
          {data.length === 1 && <Trace id={data[0][0]} />}
        </Section>
      )}
    </div>
  );
}
