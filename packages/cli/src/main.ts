/**
 * The `svc` command's client side (docs/cli.md): login, specs, agents, eval, experiments,
 * sandboxes (with an interactive shell), traces, datasets, alerts, secrets, bundles and shell
 * completion, all over the service's public HTTP API through the SDK (packages/sdk). Argument
 * parsing is commander's.
 *
 * The operator's commands (`start`, `run <service>`, `keys`, `images`, `import`) live with the
 * server (services/cli.ts), which hands them in as `operator`: they keep their own parsing and
 * meaning, and appear in `svc --help` and the completion scripts beside these.
 *
 * Every failure is one line on stderr (`svc: ...`) and an exit code (errors.ts): never a stack,
 * unless SVC_DEBUG=1.
 */
import { Command, CommanderError } from 'commander';
import { createClient, type SvcClient } from '../../sdk/src/client.ts';
import { connection, type Connection } from './config.ts';
import { CliError, describeError, EXIT } from './errors.ts';
import { keepOutputInert } from './output.ts';
import { agentsCommands } from './commands/agents.ts';
import { completionCommand } from './commands/completion.ts';
import { evalCommand } from './commands/eval.ts';
import { experimentsCommands } from './commands/experiments.ts';
import { loginCommand } from './commands/login.ts';
import { resourceCommands } from './commands/resources.ts';
import { sandboxesCommands } from './commands/sandboxes.ts';
import { specsCommands } from './commands/specs.ts';
import { tracesCommands } from './commands/traces.ts';

/** An operator command of services/cli.ts: its one-line summary, usage, and how to run it. */
export interface OperatorCommand {
  summary: string;
  usage: string;
  run(args: string[]): Promise<void>;
}

/** What every client command gets: the connection (flags, env, login file) and an SDK client on it. */
export interface CliContext {
  connection(): Connection;
  client(): SvcClient;
}

function contextOf(program: Command): CliContext {
  let conn: Connection | null = null;
  const get = () => {
    const { url, key } = program.opts<{ url?: string; key?: string }>();
    conn ??= connection({ url, key });
    return conn;
  };
  return {
    connection: get,
    client: () => {
      const c = get();
      if (!c.apiKey) throw new CliError('no API key: run `svc login` (or set SVC_API_KEY, or pass --key)');
      return createClient({ baseUrl: c.baseUrl, apiKey: c.apiKey, sandboxId: '' });
    },
  };
}

export function buildProgram(operator: Record<string, OperatorCommand> = {}): { program: Command; context: CliContext } {
  const program = new Command('svc')
    .description('Sandboxed agent evaluation service: run the service, and drive it from the terminal or CI.')
    .option('--url <url>', 'service address (default: SVC_BASE_URL, then `svc login`, then http://127.0.0.1:8080)')
    .option('--key <key>', 'API key (default: SVC_API_KEY, then `svc login`)')
    .showSuggestionAfterError(true)
    .configureOutput({ outputError: (text, write) => write(`svc: ${text.replace(/^error: /, '').trim()}\n`) })
    .exitOverride();
  const context = contextOf(program);
  for (const [name, op] of Object.entries(operator)) {
    program.command(name, { hidden: false }).description(op.summary).usage(op.usage).helpOption(false).allowUnknownOption().allowExcessArguments();
  }
  loginCommand(program, context);
  specsCommands(program, context);
  agentsCommands(program, context);
  evalCommand(program, context);
  experimentsCommands(program, context);
  sandboxesCommands(program, context);
  tracesCommands(program, context);
  resourceCommands(program, context);
  completionCommand(program);
  // Subcommands fail like the program: one line and exit 2, never commander's own exit.
  const harden = (cmd: Command) => {
    cmd.exitOverride().configureOutput({ outputError: (text, write) => write(`svc: ${text.replace(/^error: /, '').trim()}\n`) });
    cmd.commands.forEach(harden);
  };
  program.commands.forEach(harden);
  return { program, context };
}

/** Runs `svc ARGS...` and returns the exit code. */
export async function runCli(argv: string[], operator: Record<string, OperatorCommand> = {}): Promise<number> {
  const op = argv[0] !== undefined ? operator[argv[0]] : undefined;
  if (op) {
    // The operator's commands keep their own messages (a usage text spans lines) and exit code 1.
    try {
      await op.run(argv.slice(1));
      return EXIT.ok;
    } catch (err) {
      process.stderr.write(`${(err as Error).message}\n`);
      return 1;
    }
  }
  keepOutputInert();
  const { program, context } = buildProgram(operator);
  try {
    if (argv.length === 0) {
      program.outputHelp();
      return EXIT.ok;
    }
    await program.parseAsync(argv, { from: 'user' });
    return Number(process.exitCode ?? EXIT.ok);
  } catch (err) {
    if (err instanceof CommanderError) {
      // Help and version are exits with code 0; a usage error has been printed as one line.
      return err.exitCode === 0 ? EXIT.ok : EXIT.usage;
    }
    let baseUrl: string | undefined;
    try {
      baseUrl = context.connection().baseUrl;
    } catch {
      // the connection itself was the problem
    }
    process.stderr.write(`svc: ${describeError(err, baseUrl)}\n`);
    if (process.env.SVC_DEBUG === '1') process.stderr.write(`${(err as Error)?.stack ?? ''}\n`);
    return err instanceof CliError ? err.exitCode : EXIT.usage;
  }
}
