/** The file watch's inotifywait (fs-watcher.ts), run where a symlink the agent plants leads nowhere. */
import { execFile } from 'node:child_process';
import { constants } from 'node:fs';
import { access, realpath } from 'node:fs/promises';
import path from 'node:path';
import { promisify } from 'node:util';

/**
 * inotifywait -r follows symlinks: a directory swapped for a link right after its CREATE gets the
 * link's target watched (opendir and a trailing `/` follow it even with --no-dereference), and its
 * events would name host files. So it runs under bubblewrap in a mount namespace holding only the
 * watched places (each at its own host path, read-only; inotify still sees every write) and the
 * binary with its libraries: a link out of them leads nowhere there.
 */
export async function confined(command: string, roots: string[], args: string[]): Promise<[string, string[]]> {
  const binary = await findExecutable(command);
  const files = [binary, ...(await sharedLibraries(binary)), ...roots];
  const binds = files.flatMap((f) => ['--ro-bind', f, f]);
  return ['bwrap', ['--die-with-parent', '--unshare-all', ...binds, '--', binary, ...args]];
}

/** `command` as an absolute path (PATH searched); ENOENT when there is none. */
async function findExecutable(command: string): Promise<string> {
  const candidates = command.includes('/')
    ? [path.resolve(command)]
    : (process.env.PATH ?? '')
        .split(':')
        .filter(Boolean)
        .map((d) => path.join(d, command));
  for (const c of candidates) {
    if (
      await access(c, constants.X_OK).then(
        () => true,
        () => false,
      )
    )
      return realpath(c);
  }
  throw Object.assign(new Error(`${command} not found`), { code: 'ENOENT' });
}

const libraries = new Map<string, Promise<string[]>>();

/** The shared libraries (and loader) `binary` loads, as `ldd` lists them; none for a static binary. */
function sharedLibraries(binary: string): Promise<string[]> {
  let found = libraries.get(binary);
  if (!found) {
    found = promisify(execFile)('ldd', [binary]).then(
      ({ stdout }) => [...stdout.matchAll(/(?:=>\s*)?(\/\S+)\s+\(0x/g)].map((m) => m[1]!),
      () => [],
    );
    libraries.set(binary, found);
  }
  return found;
}
