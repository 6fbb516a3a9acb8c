/**
 * What the CLI prints: tables (cli-table3), a little colour when the stream is a terminal (and
 * NO_COLOR is unset), JSON for machines. Data goes to stdout; progress and notes to stderr, so
 * `--json` output can be piped as it is.
 */
import { styleText } from 'node:util';
import Table from 'cli-table3';

type Style = Parameters<typeof styleText>[0];

const colourful = (stream: NodeJS.WriteStream) => stream.isTTY === true && !process.env.NO_COLOR;

export function paint(style: Style, text: string, stream: NodeJS.WriteStream = process.stdout): string {
  return colourful(stream) ? styleText(style, text) : text;
}

export const VERDICT_STYLE: Record<string, Style> = { pass: 'green', fail: 'red', flaky: 'yellow', error: 'magenta' };

export function verdict(v: string | null | undefined, stream: NodeJS.WriteStream = process.stdout): string {
  const text = v ?? 'pending';
  return paint(VERDICT_STYLE[text] ?? 'gray', text, stream);
}

export function table(head: string[], rows: Array<Array<string | number | null | undefined>>): string {
  const t = new Table({ head, style: { head: colourful(process.stdout) ? ['cyan'] : [], border: colourful(process.stdout) ? ['gray'] : [] } });
  for (const row of rows) t.push(row.map((c) => (c === null || c === undefined ? '' : String(c))));
  return t.toString();
}

export function printJson(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

export function note(line: string): void {
  process.stderr.write(`${line}\n`);
}

export const pct = (x: number | null | undefined) => (x === null || x === undefined ? '—' : `${(x * 100).toFixed(1)}%`);
export const usd = (x: number | null | undefined) => (x === null || x === undefined ? '—' : `$${x.toFixed(4)}`);
export const ms = (x: number | null | undefined) => (x === null || x === undefined ? '—' : x >= 10_000 ? `${(x / 1000).toFixed(1)}s` : `${Math.round(x)}ms`);
export const params = (p: Record<string, unknown> | null | undefined) => (p && Object.keys(p).length > 0 ? Object.entries(p).map(([k, v]) => `${k}=${String(v)}`).join(' ') : '(default)');
