/** Boot step `secrets_resolved`: the sandbox's secrets, and a snapshot agent's required env checked against them. */
import { resolveHostSecret } from '../../kernel/secret-sources.ts';
import type { BootContext } from './context.ts';
import { StepFailed, type StepDone } from './pipeline.ts';

export async function resolveSecrets(ctx: BootContext, done: StepDone): Promise<void> {
  ctx.env.secretValues = await collectSecrets(ctx);
  checkAgentEnv(ctx);
  done({ count: Object.keys(ctx.env.secretValues).length });
}

/** Dashboard-stored plus spec-declared secrets (the spec's win on collision), and the request's over both. */
async function collectSecrets(ctx: BootContext): Promise<Record<string, string>> {
  const { request, spec } = ctx;
  const values = ctx.tenantSecrets.values(ctx.tenant);
  for (const [name, source] of Object.entries(spec.secrets)) {
    if (name in request.secrets) continue;
    if (source === 'dashboard') {
      if (!(name in values))
        throw new StepFailed(
          `required secret ${name} is missing: it is declared with source dashboard but not stored for this tenant (PUT /v1/secrets/${name})`,
        );
      continue;
    }
    try {
      values[name] = await resolveHostSecret(name, source, ctx.kernel.config);
    } catch (err) {
      throw new StepFailed(`required secret ${name} is missing: ${(err as Error).message}`);
    }
  }
  return { ...values, ...request.secrets };
}

/** A snapshot's `auth.required_env` must be set by the sandbox's secrets or the spec's env. */
function checkAgentEnv(ctx: BootContext): void {
  const agent = ctx.request.agent;
  const set = new Set([...Object.keys(ctx.env.secretValues), ...Object.keys(ctx.spec.setup.env), ...Object.keys(ctx.spec.agent?.env ?? {})]);
  const missing = (agent?.auth?.required_env ?? []).filter((name) => !set.has(name));
  if (agent && missing.length > 0) {
    throw new StepFailed(
      `required env var ${missing.join(', ')} of agent snapshot ${agent.name} v${agent.version} is missing: set it as a secret (the spec's secrets, PUT /v1/secrets/${missing[0]} or the request's secrets) or in setup.env`,
    );
  }
}
