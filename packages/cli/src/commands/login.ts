/**
 * `svc login`: checks a key against the service and keeps the address and key in the per-user
 * config file (config.ts), mode 0600. `--show` tells what a command would use and from where;
 * `--logout` forgets the key.
 */
import { createInterface } from 'node:readline';
import type { Command } from 'commander';
import { createClient } from '../../../sdk/src/client.ts';
import { SvcError } from '../../../sdk/src/client.ts';
import { configPath, connection, normaliseUrl, readConfig, writeConfig } from '../config.ts';
import { CliError } from '../errors.ts';
import type { CliContext } from '../main.ts';

/** Reads the key without echoing it on a terminal; from a pipe, its first line. */
async function readKey(): Promise<string> {
  const tty = process.stdin.isTTY === true;
  const rl = createInterface({ input: process.stdin, output: process.stderr, terminal: tty });
  if (tty) {
    process.stderr.write('API key (svc_live_…): ');
    // Nothing typed is echoed: the key is a secret.
    (rl as unknown as { _writeToOutput: (s: string) => void })._writeToOutput = () => {};
  }
  try {
    const line = await new Promise<string>((resolve, reject) => {
      rl.once('line', resolve);
      rl.once('close', () => reject(new CliError('no key given: pass --key KEY, or type it when asked')));
    });
    if (tty) process.stderr.write('\n');
    return line.trim();
  } finally {
    rl.close();
  }
}

const mask = (key: string | undefined) => (key === undefined ? '(none)' : `${key.slice(0, Math.min(12, Math.floor(key.length / 2)))}…`);

export function loginCommand(program: Command, context: CliContext): void {
  program
    .command('login')
    .description('check an API key against the service and keep the address and key in ~/.config/svc/config.json (mode 0600)')
    .option('--show', 'print the address and key in use, and where each comes from')
    .option('--logout', 'forget the stored key')
    .action(async (opts: { show?: boolean; logout?: boolean }) => {
      const file = configPath();
      if (opts.show) {
        const c = context.connection();
        process.stdout.write(`url: ${c.baseUrl} (from ${c.from.baseUrl})\nkey: ${mask(c.apiKey)} (from ${c.from.apiKey})\nconfig file: ${file}\n`);
        return;
      }
      if (opts.logout) {
        const stored = readConfig(file);
        delete stored.api_key;
        writeConfig(stored, file);
        process.stdout.write(`forgot the key stored in ${file}\n`);
        return;
      }
      const { url, key } = program.opts<{ url?: string; key?: string }>();
      const stored = readConfig(file);
      const baseUrl = normaliseUrl(url ?? process.env.SVC_BASE_URL ?? stored.base_url ?? connection({}).baseUrl);
      const apiKey = key ?? (await readKey());
      if (!apiKey) throw new CliError('no key given: pass --key KEY, or type it when asked');
      try {
        await createClient({ baseUrl, apiKey, sandboxId: '' }).specs.list();
      } catch (err) {
        if (err instanceof SvcError && err.status === 401) throw new CliError(`the service at ${baseUrl} refused the key: ${err.message}`);
        throw err;
      }
      writeConfig({ ...stored, base_url: baseUrl, api_key: apiKey }, file);
      process.stdout.write(`logged in to ${baseUrl}; saved to ${file} (mode 0600)\n`);
    });
}
