/**
 * A sandbox's secrets and the environment every command gets (secrets included: for the
 * service's own use, never shown), set by the boot (boot/secrets.ts,
 * boot/runtime.ts); and the redaction of their values from everything the sandbox says.
 */
import { redactSecrets } from '../../kernel/tenant-secrets.ts';
import type { ExecResult } from '../runtimes/runtime.ts';

/** The read-only image's command directories: nothing the agent can write is on a PATH of ours. */
export const IMAGE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export class SandboxEnv {
  /** The sandbox's secrets by name: the tenant's, the spec's and the request's. */
  secretValues: Record<string, string> = {};
  /** The environment every command gets. */
  env: Record<string, string> = {};
  /** The image's own variables (its config's Env: PATH, LANG, a tool's home...), under the spec's. */
  imageEnv: Record<string, string> = {};

  /** Replaces every secret value in text with [REDACTED:<NAME>]. */
  redact(text: string): string {
    return redactSecrets(text, this.secretValues);
  }

  /** A command's captured stream, redacted; one cut at the capture limit also loses a secret's beginning at its end. */
  output(r: ExecResult, stream: 'stdout' | 'stderr'): string {
    return redactSecrets(r[stream], this.secretValues, { cut: r.truncated[stream] });
  }
}
