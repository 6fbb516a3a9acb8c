/**
 * `svc sandboxes create|list|exec|shell|events|audit|rm`. exec runs one command and exits with
 * its exit code (stdout and stderr as the sandbox gave them); shell is interactive, over the
 * WebSocket of GET /v1/sandboxes/:id/shell (shell.ts); events follows the SSE stream.
 */
import type { Command } from 'commander';
import type { Sandbox } from '../../../sdk/src/client.ts';
import { CliError } from '../errors.ts';
import type { CliContext } from '../main.ts';
import { printJson, table } from '../output.ts';
import { secretsOf } from './eval.ts';
import { openShell } from '../shell.ts';

const collect = (value: string, previous: string[] = []) => [...previous, value];

function metadataOf(pairs: string[] | undefined): Record<string, string> | undefined {
  if (!pairs || pairs.length === 0) return undefined;
  return Object.fromEntries(
    pairs.map((pair) => {
      const eq = pair.indexOf('=');
      if (eq <= 0) throw new CliError(`--meta: "${pair}" must be KEY=VALUE`);
      return [pair.slice(0, eq), pair.slice(eq + 1)];
    }),
  );
}

/** One line of the event stream as a person reads it. */
export function eventLine(e: { id?: string; event_type: string; data: Record<string, unknown> }): string {
  const d = e.data;
  switch (e.event_type) {
    case 'status':
      return `status  ${String(d.step ?? d.state ?? '')}${Object.entries(d)
        .filter(([k]) => k !== 'step' && k !== 'state')
        .map(([k, v]) => ` ${k}=${typeof v === 'object' ? JSON.stringify(v) : String(v)}`)
        .join('')}`;
    case 'command':
      return `command ${String(d.command ?? '')} -> exit ${String(d.exit_code)} (${String(d.duration_ms)} ms)`;
    case 'audit':
      return `audit   ${String(d.type ?? '')} ${JSON.stringify(d.details ?? {})}`;
    default:
      return `${e.event_type.padEnd(7)} ${JSON.stringify(d)}`;
  }
}

export function sandboxesCommands(program: Command, context: CliContext): void {
  const sandboxes = program.command('sandboxes').alias('sb').description('sandboxes: create, list, run commands, open a shell, follow events, destroy');

  sandboxes
    .command('create')
    .description('create a sandbox of a stored spec (answers once it is ready)')
    .argument('<spec-id>')
    .option('--timeout <duration>', "auto-destroy after, e.g. 30m (default: the spec's)")
    .option('--meta <KEY=VALUE>', 'a metadata tag (repeatable)', collect)
    .option('--secret <NAME=VALUE>', 'a secret (repeatable)', collect)
    .option('--json', 'the sandbox as JSON')
    .action(async (specId: string, opts: { timeout?: string; meta?: string[]; secret?: string[]; json?: boolean }) => {
      const sb = await context.client().sandboxes.create({
        spec_id: specId,
        ...(opts.timeout && { timeout: opts.timeout }),
        ...(opts.meta && { metadata: metadataOf(opts.meta) }),
        ...(opts.secret && { secrets: secretsOf(opts.secret) }),
      });
      if (opts.json) return printJson(sb);
      process.stdout.write(`${sb.id}\n`);
      process.stderr.write(`sandbox ${sb.id} is ${sb.state}; \`svc sandboxes shell ${sb.id}\` opens a shell\n`);
    });

  sandboxes
    .command('list')
    .description('live sandboxes')
    .option('--json', 'as JSON')
    .action(async (opts: { json?: boolean }) => {
      const list = await context.client().sandboxes.list();
      if (opts.json) return printJson(list);
      process.stdout.write(
        `${table(
          ['id', 'spec', 'state', 'created', 'expires'],
          list.map((s: Sandbox) => [s.id, s.spec_id, s.state, s.created_at, String(s.expires_at ?? '')]),
        )}\n`,
      );
    });

  sandboxes
    .command('exec')
    .description('run one command in the sandbox (sh -c, from /workspace) and exit with its exit code')
    .argument('<id>')
    .argument('<command...>', 'the command; put -- before it when it has options')
    .option('--timeout <duration>', 'kill it after, e.g. 30s')
    .option('--json', 'the result as JSON')
    .action(async (id: string, words: string[], opts: { timeout?: string; json?: boolean }) => {
      const result = await context.client().sandboxes.command(id, words.join(' '), opts.timeout ? { timeout: opts.timeout } : {});
      if (opts.json) printJson(result);
      else {
        process.stdout.write(result.stdout);
        process.stderr.write(result.stderr);
      }
      process.exitCode = result.exit_code;
    });

  sandboxes
    .command('shell')
    .description('an interactive shell in the sandbox: a real terminal over a WebSocket (`exit` or Ctrl-D leaves)')
    .argument('<id>')
    .option('--timeout <duration>', 'hang the shell up after, e.g. 30m (default: when the sandbox ends)')
    .action(async (id: string, opts: { timeout?: string }) => {
      const c = context.connection();
      if (!c.apiKey) throw new CliError('no API key: run `svc login` (or set SVC_API_KEY, or pass --key)');
      process.exitCode = await openShell({ baseUrl: c.baseUrl, apiKey: c.apiKey, sandboxId: id, timeout: opts.timeout });
    });

  sandboxes
    .command('events')
    .description("follow the sandbox's event stream (boot steps, commands, audit) until it is destroyed")
    .argument('<id>')
    .option('--json', 'one JSON object per line')
    .action(async (id: string, opts: { json?: boolean }) => {
      for await (const e of context.client().sandboxes.events(id)) {
        process.stdout.write(opts.json ? `${JSON.stringify(e)}\n` : `${eventLine(e)}\n`);
      }
    });

  sandboxes
    .command('audit')
    .description("the sandbox's audit log (also after it is destroyed)")
    .argument('<id>')
    .option('--type <types>', 'only these types, comma-separated (process_spawn,file_write,...)')
    .option('--json', 'one JSON object per line')
    .action(async (id: string, opts: { type?: string; json?: boolean }) => {
      const client = context.client();
      let cursor: string | undefined;
      do {
        const page = await client.sandboxes.audit(id, { limit: 1000, ...(opts.type && { type: opts.type }), ...(cursor && { cursor }) });
        for (const r of page.items) process.stdout.write(opts.json ? `${JSON.stringify(r)}\n` : `${r.ts} ${r.type} ${JSON.stringify(r.details)}\n`);
        cursor = page.next_cursor;
      } while (cursor);
    });

  sandboxes
    .command('rm')
    .description('destroy sandboxes')
    .argument('<ids...>')
    .action(async (ids: string[]) => {
      const client = context.client();
      for (const id of ids) {
        await client.sandboxes.destroy(id);
        process.stdout.write(`destroyed ${id}\n`);
      }
    });
}
