/**
 * Numbered SQL migrations, one implementation for both store adapters.
 *
 * Files are `migrations/NNNN_name.sql`, applied in version order. A file may hold several
 * statements, each ended by `;` at the end of a line; `--` comment lines are allowed anywhere.
 * Each applied file is recorded in `schema_migrations` (version, name, sha-256 checksum,
 * applied_at), so a second run applies nothing, and an applied file whose text changed since is an
 * error that names it: history is append-only, a change is a new file.
 *
 * ClickHouse has no transactional DDL: a process that dies in the middle of a file leaves it
 * unrecorded and the next start runs the whole file again. So every statement must be safe to run
 * twice (`CREATE TABLE IF NOT EXISTS`, `ADD COLUMN IF NOT EXISTS`, ...). There is no lock either,
 * and every process that opens a store runs migrate() at its start (kernel/kernel.ts), so in the
 * distributed deployment several may run it at once. Idempotent statements make that safe: two
 * racing processes run a file twice and at worst record its version twice, which is harmless
 * (the applied versions are read into a map by version).
 *
 * `0001_schema_migrations.sql` creates the tracking table itself; until it exists nothing counts
 * as applied. It uses only types an old server knows (DateTime, not DateTime64), so the
 * bootstrap also works against Debian's 18.16 test server.
 */

import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AppError } from '../errors.ts';
import { formatDateTime } from './encoding.ts';
import type { Store } from './store.ts';

/** The directory of the project's migrations. */
export const MIGRATIONS_DIR = join(dirname(fileURLToPath(import.meta.url)), 'migrations');

export interface Migration {
  version: number;
  /** File name without `.sql`, e.g. `0002_trace_events`. */
  name: string;
  checksum: string;
  statements: string[];
}

const FILE = /^(\d{4})_([a-z0-9_]+)\.sql$/;

/** Splits a file into statements at `;` + end of line, dropping comment-only lines and blanks. */
export function splitStatements(sql: string): string[] {
  const statements: string[] = [];
  let current: string[] = [];
  for (const line of sql.split(/\r?\n/)) {
    if (/^\s*--/.test(line)) continue;
    const end = /;\s*$/.exec(line);
    if (end) {
      current.push(line.slice(0, end.index));
      const text = current.join('\n').trim();
      if (text !== '') statements.push(text);
      current = [];
    } else {
      current.push(line);
    }
  }
  const rest = current.join('\n').trim();
  if (rest !== '') statements.push(rest);
  return statements;
}

/** Reads and orders the migration files of `dir`; a misnamed `.sql` file or a duplicate version is an error. */
export function loadMigrations(dir: string = MIGRATIONS_DIR): Migration[] {
  const migrations: Migration[] = [];
  for (const file of readdirSync(dir).sort()) {
    if (!file.endsWith('.sql')) continue;
    const match = FILE.exec(file);
    if (!match) throw new AppError('internal', `migration ${file}: name must be NNNN_lowercase_name.sql`);
    const text = readFileSync(join(dir, file), 'utf8');
    const version = Number(match[1]);
    const previous = migrations.at(-1);
    if (previous && previous.version === version) {
      throw new AppError('internal', `migrations ${previous.name} and ${file}: same version ${match[1]}`);
    }
    migrations.push({
      version,
      name: file.slice(0, -'.sql'.length),
      checksum: createHash('sha256').update(text).digest('hex'),
      statements: splitStatements(text),
    });
  }
  return migrations;
}

interface AppliedRow {
  version: number;
  name: string;
  checksum: string;
}

type MigrationTarget = Pick<Store, 'query' | 'command' | 'insert'>;

/** Applies the migrations of `dir` not yet recorded in `schema_migrations`; returns their names. */
export async function migrate(store: MigrationTarget, dir: string = MIGRATIONS_DIR): Promise<string[]> {
  const migrations = loadMigrations(dir);
  const applied = await appliedMigrations(store);
  for (const migration of migrations) {
    const row = applied.get(migration.version);
    if (row && row.checksum !== migration.checksum) {
      throw new AppError(
        'internal',
        `migration ${migration.name}.sql was changed after it was applied (as ${row.name}.sql): ` +
          'applied migrations are immutable, put the change in a new file',
      );
    }
  }
  const done: string[] = [];
  for (const migration of migrations) {
    if (applied.has(migration.version)) continue;
    for (const [i, statement] of migration.statements.entries()) {
      try {
        await store.command(statement);
      } catch (err) {
        const reason = err instanceof Error ? err.message : String(err);
        throw new AppError('internal', `migration ${migration.name}.sql, statement ${i + 1}: ${reason}`, { cause: err });
      }
    }
    await store.insert('schema_migrations', [
      {
        version: migration.version,
        name: migration.name,
        checksum: migration.checksum,
        applied_at: formatDateTime(new Date(Math.floor(Date.now() / 1000) * 1000)),
      },
    ]);
    done.push(migration.name);
  }
  return done;
}

async function appliedMigrations(store: MigrationTarget): Promise<Map<number, AppliedRow>> {
  const [exists] = await store.query<{ result: number | string }>('EXISTS TABLE schema_migrations');
  const applied = new Map<number, AppliedRow>();
  if (!exists || Number(exists.result) !== 1) return applied;
  const rows = await store.query<AppliedRow>('SELECT version, name, checksum FROM schema_migrations ORDER BY version');
  for (const row of rows) applied.set(Number(row.version), row);
  return applied;
}
