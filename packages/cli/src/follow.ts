/**
 * Following an experiment as it runs. The service offers no experiment stream (the one SSE
 * endpoint is a sandbox's), and the contract says completion is observed by polling
 * `GET /v1/experiments/:id`: so the CLI polls (every 500 ms by default) and draws a progress bar
 * (cli-progress) on stderr: done/total runs, the scenarios' verdicts so far, and the ETA from the
 * rate runs finish at. Off a terminal it prints one line per change instead, which CI logs keep
 * readable.
 */
import { SingleBar } from 'cli-progress';
import type { SvcClient } from '../../sdk/src/client.ts';
import { CliError, EXIT } from './errors.ts';
import { drawingStream } from './output.ts';
import { FINAL_STATES, type RunResults } from './results.ts';

export interface FollowOptions {
  intervalMs: number;
  /** No bar and no lines (--json off a terminal). */
  quiet: boolean;
}

const FORMAT = '{bar} {value}/{total} runs | {status} | pass {pass} fail {fail} flaky {flaky} error {error} | ETA {eta_formatted}';

function payload(r: RunResults) {
  return { status: r.status, pass: r.counts.pass, fail: r.counts.fail, flaky: r.counts.flaky, error: r.counts.error };
}

/** Polls until the experiment is completed, failed or cancelled; resolves with its RunResults. */
export async function followExperiment(client: SvcClient, id: string, options: FollowOptions): Promise<RunResults> {
  const tty = process.stderr.isTTY === true && !options.quiet;
  const bar = tty
    ? new SingleBar({
        format: FORMAT,
        stream: drawingStream(process.stderr) as NodeJS.WriteStream,
        hideCursor: true,
        etaBuffer: 20,
        fps: 10,
        barsize: 30,
        clearOnComplete: false,
        barCompleteChar: '█',
        barIncompleteChar: '░',
      })
    : null;
  let started = false;
  let lastLine = '';
  const onInterrupt = () => {
    bar?.stop();
    process.stderr.write(
      `\nexperiment ${id} keeps running on the service: \`svc experiments show ${id} --watch\` follows it again, \`svc experiments cancel ${id}\` stops it\n`,
    );
    process.exit(EXIT.interrupted);
  };
  process.once('SIGINT', onInterrupt);
  try {
    for (;;) {
      const r = await client.experiments.get(id);
      const total = r.total_runs ?? 0;
      if (bar) {
        if (!started && total > 0) {
          bar.start(total, r.scored_runs, payload(r));
          started = true;
        } else if (started) {
          bar.setTotal(total);
          bar.update(r.scored_runs, payload(r));
        }
      } else if (!options.quiet) {
        const line = `${r.status}: ${r.scored_runs}/${total || '?'} runs, pass ${r.counts.pass} fail ${r.counts.fail} flaky ${r.counts.flaky} error ${r.counts.error}`;
        if (line !== lastLine) process.stderr.write(`${line}\n`);
        lastLine = line;
      }
      if (FINAL_STATES.has(r.status)) {
        if (bar && started) {
          bar.update(r.scored_runs, payload(r));
          bar.stop();
        }
        return r;
      }
      await new Promise((resolve) => setTimeout(resolve, options.intervalMs));
    }
  } catch (err) {
    bar?.stop();
    throw err;
  } finally {
    process.removeListener('SIGINT', onInterrupt);
  }
}

export function intervalOf(text: string | undefined): number {
  if (text === undefined) return 500;
  const n = Number(text);
  if (!Number.isInteger(n) || n < 50 || n > 60_000) throw new CliError(`--interval: ${text} is not a number of milliseconds from 50 to 60000`);
  return n;
}
