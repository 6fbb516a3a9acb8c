/**
 * Limits of sandbox commands. Every command runs as `sh -c COMMAND` with its
 * environment, and Linux takes at most 128 KiB per argument or environment string, its NUL
 * included (MAX_ARG_STRLEN): a longer command could only fail at exec. The api refuses a longer
 * command with a 400; the runtime refuses it too (setup commands and checks do not pass the api),
 * so a request never grows past what the sandbox's supervisor reads.
 */

/** Longest command in bytes (UTF-8). */
export const MAX_COMMAND_BYTES = 128 * 1024 - 1;
/** Longest `KEY=VALUE` of a command's environment, in bytes. */
const MAX_ENV_ENTRY_BYTES = 128 * 1024 - 1;
/** A command's whole environment, every `KEY=VALUE` counted with its NUL. */
const MAX_ENV_BYTES = 1024 * 1024;

/**
 * Commands running in one sandbox at once (background ones included): each holds its captured
 * output (up to 1 MiB of stdout and of stderr) until it ends. One more fails with exit 126.
 */
export const MAX_COMMANDS_AT_ONCE = 64;

/** Why `command` is too long, or null. */
export function commandSizeProblem(command: string): string | null {
  const bytes = Buffer.byteLength(command, 'utf8');
  return bytes > MAX_COMMAND_BYTES ? `is ${bytes} bytes; a command may have at most ${MAX_COMMAND_BYTES} bytes (128 KiB, Linux's limit on one argument)` : null;
}

/** Why `env` is too large, or null. */
export function envSizeProblem(env: Record<string, string>): string | null {
  let total = 0;
  for (const [key, value] of Object.entries(env)) {
    const bytes = Buffer.byteLength(key, 'utf8') + 1 + Buffer.byteLength(value, 'utf8');
    if (bytes > MAX_ENV_ENTRY_BYTES) return `${key} is ${bytes} bytes; one variable may have at most ${MAX_ENV_ENTRY_BYTES} bytes (KEY=VALUE, 128 KiB)`;
    total += bytes + 1;
  }
  return total > MAX_ENV_BYTES ? `the environment is ${total} bytes; at most ${MAX_ENV_BYTES} bytes (1 MiB) in all` : null;
}
