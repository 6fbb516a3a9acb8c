/**
 * What a firing says on each channel (docs/alerts.md): the webhook body of the contract, the
 * rich card a Slack incoming webhook or the bot posts (Block Kit), and the email.
 */
import type { AlertFired } from '../domain/events/alert-events.ts';
import { formatValue } from '../domain/alerts.ts';

/** The contract's webhook body: exactly its eight fields. */
export function webhookBody(f: AlertFired) {
  return {
    rule_id: f.rule_id,
    rule_name: f.rule_name,
    reason: f.reason,
    experiment_id: f.experiment_id,
    experiment_name: f.experiment_name,
    fired_at: new Date(f.fired_at).toISOString(),
    metric_value: f.metric_value,
    threshold: f.threshold,
  };
}

/** The link to the experiment's results (the API's; it needs a key). */
const resultsUrl = (f: AlertFired, baseUrl: string) => `${baseUrl}/v1/experiments/${f.experiment_id}`;

/** Slack's mrkdwn escapes: &, <, >. */
const esc = (text: string) => text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

/** A card in Block Kit: header, the reason, the facts as fields, when and where. `text` is the notification's fallback. */
export function slackMessage(f: AlertFired, baseUrl: string) {
  const regression = f.condition.trim().endsWith('regressed');
  const facts: Array<[string, string]> = [
    ['Experiment', `<${resultsUrl(f, baseUrl)}|${esc(f.experiment_name)}> (\`${f.experiment_id}\`)`],
    ['Spec', `\`${esc(f.spec_id)}\``],
    ['Condition', `\`${esc(f.condition)}\`${f.window ? ` over \`${f.window}\`` : ''}`],
    [regression ? 'Candidate' : 'Value', `*${formatValue(f.metric_value)}*`],
    [regression ? 'Baseline' : 'Threshold', formatValue(f.threshold)],
    ['Rule', `${esc(f.rule_name)} (\`${f.rule_id}\`)`],
  ];
  return {
    text: `Alert "${f.rule_name}": ${f.reason}`,
    blocks: [
      { type: 'header', text: { type: 'plain_text', text: `:rotating_light: ${f.rule_name}`.slice(0, 150), emoji: true } },
      { type: 'section', text: { type: 'mrkdwn', text: esc(f.reason).slice(0, 3000) } },
      { type: 'section', fields: facts.map(([k, v]) => ({ type: 'mrkdwn', text: `*${k}*\n${v}` })) },
      { type: 'context', elements: [{ type: 'mrkdwn', text: `Fired ${new Date(f.fired_at).toISOString()} · firing \`${f.firing_id}\`` }] },
    ],
  };
}

/** The email: a subject that says what crossed, a plain-text body and its HTML twin. */
export function emailMessage(f: AlertFired, baseUrl: string): { subject: string; text: string; html: string } {
  const rows: Array<[string, string]> = [
    ['Rule', `${f.rule_name} (${f.rule_id})`],
    ['Experiment', `${f.experiment_name} (${f.experiment_id})`],
    ['Spec', f.spec_id],
    ['Condition', `${f.condition}${f.window ? ` over ${f.window}` : ''}`],
    ['Metric value', formatValue(f.metric_value)],
    ['Threshold', formatValue(f.threshold)],
    ['Fired at', new Date(f.fired_at).toISOString()],
    ['Results', resultsUrl(f, baseUrl)],
  ];
  const html = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
  return {
    subject: `[svc alert] ${f.rule_name}: ${f.metric} ${formatValue(f.metric_value)}`.slice(0, 250),
    text: `${f.reason}\n\n${rows.map(([k, v]) => `${k}: ${v}`).join('\n')}\n\nfiring ${f.firing_id}\n`,
    html: `<p>${html(f.reason)}</p><table>${rows.map(([k, v]) => `<tr><th align="left">${html(k)}</th><td>${html(v)}</td></tr>`).join('')}</table><p><small>firing ${html(f.firing_id)}</small></p>`,
  };
}
