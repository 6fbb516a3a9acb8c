/**
 * What a sandbox needs to know of the agent snapshot its spec names: the api resolves the spec's
 * `snapshot` or `snapshot_id` to one row and sends this with the create request, so the runner
 * needs no view of the agents.
 */

/** AgentAuth of the spec: what the agent needs from the sandbox. */
export interface AgentAuth {
  /** Env vars the agent needs; the boot fails naming the first one missing. */
  required_env?: string[];
  /** Files written at boot; `{{secrets.NAME}}` in a template is filled in (a missing secret fails the boot). */
  config_files?: Array<{ path: string; template: string }>;
  /** Hosts the agent reaches, with their ports; they join the spec's egress allow list. */
  egress?: Record<string, string[]>;
}

export interface ResolvedAgent {
  snapshot_id: string;
  name: string;
  version: number;
  digest: string;
  /** The spec's `entrypoint` when it sets one, else the bundle's. */
  entrypoint: string[];
  auth: AgentAuth | null;
}

const SECRET_REFERENCE = /\{\{\s*secrets\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}/g;

/** Fills `{{secrets.NAME}}` in a config file template; throws naming the first secret not set. */
export function renderConfigTemplate(template: string, secrets: Readonly<Record<string, string>>): string {
  return template.replace(SECRET_REFERENCE, (_match, name: string) => {
    if (!(name in secrets)) throw new Error(`secret ${name} is not set`);
    return secrets[name];
  });
}
