/**
 * Boot step `services_started`: the backing services (backing/), started with the runtime, are
 * waited for as their `wait_for` says; then the gateway serves the sandbox, its services
 * included, under its policy.
 */
import type { EgressGateway } from '../network/gateway.ts';
import type { BootContext } from './context.ts';
import { StepFailed, type StepDone } from './pipeline.ts';

export async function startServices(ctx: BootContext, done: StepDone): Promise<void> {
  const { backing, network, trail } = ctx;
  await backing.waitReady().catch((err: Error) => {
    throw new StepFailed(err.message);
  });
  for (const warning of backing.warnings) trail.warnWhileBooting(warning);
  if (network.wanted) {
    await network.attach(
      ctx.box.handle,
      ctx.gateway as EgressGateway,
      ctx.env.secretValues,
      await backing.endpoints(),
      (type, details) => void trail.log!.record(type, details).catch(() => undefined),
    );
  }
  done({ count: backing.count, services: backing.view() });
}
