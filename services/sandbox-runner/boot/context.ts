/**
 * What a boot step (boot/steps.ts) is given: the sandbox's request and spec, the runner's
 * shared pieces (runtime, egress gateway, bundles) and the sandbox's parts (parts/), made by
 * LiveSandbox before the boot. A step starts parts; what it started is already on the sandbox's
 * teardown stack, so a step that fails leaves nothing behind.
 */
import type { Kernel } from '../../kernel/actor.ts';
import type { ExtractedBundles } from '../../kernel/bundles.ts';
import type { TenantSecrets } from '../../kernel/tenant-secrets.ts';
import type { SandboxChanged } from '../../domain/events/sandbox-events.ts';
import type { CreateRequest } from '../../domain/sandbox-ops.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import type { BackingServices } from '../backing/backing-services.ts';
import type { EgressGateway } from '../network/gateway.ts';
import type { SandboxNetwork } from '../network/sandbox-network.ts';
import type { Runtime } from '../runtimes/runtime.ts';
import type { ActivityCapture } from '../parts/activity-capture.ts';
import type { AuditTrail } from '../parts/audit-trail.ts';
import type { SandboxBox } from '../parts/sandbox-box.ts';
import type { SandboxEnv } from '../parts/sandbox-env.ts';
import type { EmitEvent } from '../parts/sandbox-events.ts';

export interface BootContext {
  readonly kernel: Kernel;
  readonly runtime: Runtime;
  /** the runner's egress gateway, or why it did not start */
  readonly gateway: EgressGateway | string;
  /** agent bundles (mounted at /agent) and task-file bundles (copied in), extracted once per content */
  readonly bundles: { agents: ExtractedBundles; taskFiles: ExtractedBundles };
  readonly tenant: string;
  readonly sandboxId: string;
  /** the tenants' stored secrets (source dashboard) */
  readonly tenantSecrets: TenantSecrets;
  /** The sandbox's own API key, SVC_API_KEY inside. */
  readonly token: string;
  readonly request: CreateRequest;
  readonly spec: SpecDocument;
  readonly env: SandboxEnv;
  readonly box: SandboxBox;
  readonly backing: BackingServices;
  readonly network: SandboxNetwork;
  readonly trail: AuditTrail;
  readonly capture: ActivityCapture;
  readonly event: EmitEvent;
  /** Writes the sandbox's entity in `state` (svc.sandboxes). */
  setState(state: SandboxChanged['state']): Promise<void>;
  /** Starts what runs once the sandbox is ready: its timer, its shells, the watch for its end. */
  startLife(): void;
}
