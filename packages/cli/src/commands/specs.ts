/**
 * `svc specs validate|push|list|show|rm`. validate and push check each file locally first
 * (spec-check.ts) and print every problem as `FILE:LINE:COLUMN: path: problem`; push then
 * stores it (POST /v1/specs), which also checks what needs the tenant's data.
 */
import { readFileSync } from 'node:fs';
import type { Command } from 'commander';
import type { SvcClient } from '../../../sdk/src/client.ts';
import { CliError, EXIT } from '../errors.ts';
import type { CliContext } from '../main.ts';
import { printJson, table } from '../output.ts';
import { checkSpec, type SpecCheck } from '../spec-check.ts';

export function readText(file: string): string {
  try {
    return readFileSync(file, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new CliError(`${file}: ${code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'is a directory, not a spec file' : (err as Error).message}`);
  }
}

/** Checks a spec file, printing its problems; throws when it has any. */
export function validFile(file: string): { text: string; check: Extract<SpecCheck, { ok: true }> } {
  const text = readText(file);
  const check = checkSpec(text);
  if (!check.ok) {
    for (const p of check.problems) process.stderr.write(`${file}:${p.line}:${p.column}: ${p.message}\n`);
    throw new CliError(`${file}: ${check.problems.length} problem${check.problems.length === 1 ? '' : 's'}; nothing was pushed`, EXIT.usage);
  }
  return { text, check };
}

/** Stores the spec unless the service already has exactly this text as its latest version. */
export async function pushSpec(client: SvcClient, text: string, id: string): Promise<{ version: number; changed: boolean }> {
  try {
    const current = await client.specs.get(id);
    if (current.yaml === text) return { version: current.version, changed: false };
  } catch (err) {
    if ((err as { status?: number }).status !== 404) throw err;
  }
  const stored = await client.specs.put(text);
  return { version: stored.version, changed: true };
}

export function specsCommands(program: Command, context: CliContext): void {
  const specs = program.command('specs').description('validate, push and read spec documents');

  specs
    .command('validate')
    .description("check spec files against the JSON Schema and the service's rules, locally; problems as FILE:LINE:COLUMN")
    .argument('<files...>')
    .action((files: string[]) => {
      let bad = 0;
      for (const file of files) {
        const check = checkSpec(readText(file));
        if (check.ok) process.stdout.write(`${file}: ok (spec ${check.spec.id})\n`);
        else {
          bad += 1;
          for (const p of check.problems) process.stdout.write(`${file}:${p.line}:${p.column}: ${p.message}\n`);
        }
      }
      if (bad > 0) throw new CliError(`${bad} of ${files.length} spec file${files.length === 1 ? '' : 's'} invalid`);
    });

  specs
    .command('push')
    .description('validate locally, then store each spec (a new version when its text changed)')
    .argument('<files...>')
    .option('--json', 'print the stored records as JSON')
    .action(async (files: string[], opts: { json?: boolean }) => {
      const checked = files.map((file) => ({ file, ...validFile(file) }));
      const client = context.client();
      const out = [];
      for (const { file, text, check } of checked) {
        const { version, changed } = await pushSpec(client, text, check.spec.id);
        out.push({ file, id: check.spec.id, version, changed });
        if (!opts.json) process.stdout.write(`${file}: spec ${check.spec.id} ${changed ? `pushed as version ${version}` : `unchanged (version ${version})`}\n`);
      }
      if (opts.json) printJson(out);
    });

  specs
    .command('list')
    .description('the latest version of each stored spec')
    .option('--json', 'as JSON')
    .action(async (opts: { json?: boolean }) => {
      const { items } = await context.client().specs.list();
      if (opts.json) return printJson(items);
      process.stdout.write(
        `${table(
          ['id', 'version', 'created'],
          items.map((s) => [String(s.id ?? s.spec_id), s.version, String(s.created_at ?? '')]),
        )}\n`,
      );
    });

  specs
    .command('show')
    .description("print a stored spec's YAML (latest, or --version N)")
    .argument('<id>')
    .option('--version <n>', 'a stored version')
    .option('--json', 'the whole record as JSON')
    .action(async (id: string, opts: { version?: string; json?: boolean }) => {
      const record = await context.client().specs.get(id, opts.version === undefined ? undefined : Number(opts.version));
      if (opts.json) return printJson(record);
      process.stdout.write(String(record.yaml ?? ''));
    });

  specs
    .command('rm')
    .description('delete a spec and every version of it')
    .argument('<id>')
    .action(async (id: string) => {
      await context.client().specs.delete(id);
      process.stdout.write(`deleted spec ${id}\n`);
    });
}
