/**
 * The boot pipeline, in the service spec's order (its nine steps, "Boot pipeline, in order"), run by
 * `runBoot` (pipeline.ts) over a sandbox's BootContext (context.ts). Each step is one function
 * of its own module; it reports itself done with a `status` event named as here, and a failure
 * in it names it too. A new step is a new entry at its place in the spec's order.
 */
import { startAuditCapture } from './audit.ts';
import { applyFixtures } from './apply-fixtures.ts';
import type { BootContext } from './context.ts';
import { configureNetwork } from './network.ts';
import type { BootStep } from './pipeline.ts';
import { markReady, takeSnapshot } from './ready.ts';
import { startRuntime } from './runtime.ts';
import { resolveSecrets } from './secrets.ts';
import { startServices } from './services.ts';
import { applySetup } from './setup.ts';

export const BOOT_STEPS: readonly BootStep<BootContext>[] = [
  { name: 'secrets_resolved', run: resolveSecrets },
  { name: 'container_started', run: startRuntime },
  { name: 'services_started', run: startServices },
  { name: 'fixtures_applied', run: applyFixtures },
  { name: 'setup_applied', run: applySetup },
  { name: 'network_configured', run: configureNetwork },
  { name: 'audit_started', run: startAuditCapture },
  { name: 'snapshot_taken', run: takeSnapshot },
  // A failure to mark ready is reported at snapshot_taken, as it always has been.
  { name: 'ready', failsAs: 'snapshot_taken', run: markReady },
];
