/** Two experiments side by side: paired scenarios, metric deltas and their significance. */
import type { ComparedSide as Side } from '../../../sdk/src/client.ts';
import { api } from '../api.ts';
import { useLoad } from '../hooks.ts';
import { href } from '../router.ts';
import { ErrorBox, Loading, num, paramsText, Section, Verdict } from '../ui.tsx';

const side = (s: Side) => (
  <>
    <Verdict value={s.verdict} /> {s.passed}/{s.passed + s.failed}
    {s.errored ? ` (+${s.errored} error)` : ''}
  </>
);

export function Compare({ baseline, candidate }: { baseline: string; candidate: string }) {
  const { data: c, error, loading } = useLoad(async () => await api().experiments.compare(baseline, candidate), [baseline, candidate]);
  if (loading && !c) return <Loading />;
  if (!c) return <ErrorBox error={error} />;
  return (
    <div class="compare" data-regressed={String(c.regressed)}>
      <h1>
        <a href={href('experiments', c.candidate_id)}>{c.candidate_id}</a> against <a href={href('experiments', c.baseline_id)}>{c.baseline_id}</a>
      </h1>
      <p class={c.regressed ? 'banner bad' : 'banner good'}>
        {c.regressed ? `Regressed: ${c.regressions.join(', ')}` : 'No significant regression'}
        {c.alpha ? ` (α = ${c.alpha})` : ''}
      </p>
      <Section title="Metrics">
        <table class="list metrics">
          <thead>
            <tr>
              <th>metric</th>
              <th>baseline</th>
              <th>candidate</th>
              <th>delta</th>
              <th>direction</th>
              <th>test</th>
              <th>p</th>
            </tr>
          </thead>
          <tbody>
            {c.metrics.map((m) => (
              <tr class={m.regressed ? 'failed' : ''} data-metric={m.name}>
                <td>{m.name}</td>
                <td>{num(m.baseline)}</td>
                <td>{num(m.candidate)}</td>
                <td>{num(m.delta)}</td>
                <td class={`dir-${m.direction}`}>{m.direction}</td>
                <td>{m.test ?? ''}</td>
                <td>{typeof m.p_value === 'number' ? m.p_value.toFixed(3) : ''}</td>
              </tr>
            ))}
          </tbody>
        </table>
        {(c.not_comparable ?? []).length > 0 && <p class="muted">Not comparable (no value on one side): {c.not_comparable!.join(', ')}</p>}
      </Section>
      <Section title={`Paired scenarios (${(c.scenarios ?? []).length})`}>
        <table class="list paired">
          <thead>
            <tr>
              <th>scenario</th>
              <th>baseline</th>
              <th>candidate</th>
              <th>p</th>
              <th>regressed</th>
            </tr>
          </thead>
          <tbody>
            {(c.scenarios ?? []).map((s) => (
              <tr class={s.regressed ? 'failed' : ''}>
                <td>{paramsText(s.params)}</td>
                <td>{side(s.baseline)}</td>
                <td>{side(s.candidate)}</td>
                <td>{typeof s.p_value === 'number' ? s.p_value.toFixed(3) : ''}</td>
                <td>{s.regressed ? 'yes' : ''}</td>
              </tr>
            ))}
          </tbody>
        </table>
        {c.unpaired && (c.unpaired.baseline.length > 0 || c.unpaired.candidate.length > 0) && (
          <p class="muted">
            Unpaired: baseline {c.unpaired.baseline.map((u) => paramsText(u.params)).join(', ') || 'none'}; candidate{' '}
            {c.unpaired.candidate.map((u) => paramsText(u.params)).join(', ') || 'none'}
          </p>
        )}
      </Section>
    </div>
  );
}
