/**
 * How the CLI fails: one clear line on stderr, never a stack trace, and an exit code a script
 * can branch on (docs/cli.md, "Exit codes").
 */
import { SvcError } from '../../sdk/src/client.ts';

/** Exit codes of every command. `exec` passes the command's own code through instead. */
export const EXIT = {
  ok: 0,
  /** The experiment failed: a scenario does not pass, or it ended failed or cancelled. */
  failed: 1,
  /** Bad input, a refused request, an unreachable service. */
  usage: 2,
  /** The experiment regressed against its baseline. */
  regressed: 3,
  interrupted: 130,
} as const;

/** A failure the CLI explains itself; its message is the whole line shown. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number = EXIT.usage,
  ) {
    super(message);
    this.name = 'CliError';
  }
}

/** The one line that explains `err`. */
export function describeError(err: unknown, baseUrl?: string): string {
  const line = (text: string) => text.replace(/\s*\n\s*/g, ' ').trim();
  if (err instanceof CliError) return line(err.message);
  if (err instanceof SvcError) {
    const hint = err.status === 401 ? ' (run `svc login`, or set SVC_API_KEY)' : '';
    return line(`${err.status} ${err.error}: ${err.message}${hint}`);
  }
  const cause = (err as { cause?: { code?: string; message?: string } })?.cause;
  if (err instanceof TypeError && /fetch failed/i.test(err.message)) {
    return line(
      `cannot reach the service${baseUrl ? ` at ${baseUrl}` : ''}: ${cause?.code ?? cause?.message ?? err.message} (is it running? \`svc login --url URL\` or SVC_BASE_URL points elsewhere)`,
    );
  }
  if ((err as { code?: string })?.code === 'ENOENT' || (err as { code?: string })?.code === 'EACCES') return line((err as Error).message);
  return line(`internal error: ${(err as Error)?.message ?? String(err)} (SVC_DEBUG=1 shows the stack)`);
}
