/**
 * Boot step `network_configured`: the sandbox's network (network/sandbox-network.ts), its link
 * made while the runtime started: from now on the gateway lets out what the policy allows.
 * Determinism was applied as the runtime started. Waits for the sandbox's bridge to the service
 * too.
 */
import type { BootContext } from './context.ts';
import type { StepDone } from './pipeline.ts';

export async function configureNetwork(ctx: BootContext, done: StepDone): Promise<void> {
  const { spec, network } = ctx;
  await ctx.box.handle.serviceReachable;
  const view = network.wanted ? await network.openIngress(ctx.box.handle) : null;
  done({
    egress: spec.network.egress.default,
    egress_allow: network.allow,
    ...(view ? { address: view.address, ingress: view.ingress } : {}),
    determinism: { frozen_time: spec.determinism.frozenTime, seed: spec.determinism.seed, dns: Object.keys(spec.determinism.dns).length },
  });
}
