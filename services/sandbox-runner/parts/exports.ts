/**
 * `teardown.export`: what a sandbox leaves in the artifacts directory when it ends (its audit
 * log, a snapshot of its workspace, a database's dump), and what each mock in record mode saw.
 * A step of the teardown stack: after the audit log is closed, before the backing services stop.
 */
import { mkdir, writeFile as writeHostFile } from 'node:fs/promises';
import path from 'node:path';
import { stringify as stringifyYaml } from 'yaml';
import type { Config } from '../../kernel/config.ts';
import type { CreateRequest } from '../../domain/sandbox-ops.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import type { BackingServices } from '../backing/backing-services.ts';
import { AUDIT_FILE } from '../workspace/audit-log.ts';
import { copyFileOut } from '../workspace/files.ts';
import { SERVICE_DIR } from '../workspace/paths.ts';
import type { ActivityCapture } from './activity-capture.ts';
import type { SandboxBox } from './sandbox-box.ts';
import type { EmitEvent } from './sandbox-events.ts';

export interface ExportsDeps {
  config: Config;
  tenant: string;
  sandboxId: string;
  spec: SpecDocument;
  request: CreateRequest;
  box: SandboxBox;
  backing: BackingServices;
  capture: ActivityCapture;
  event: EmitEvent;
}

/** Writes the spec's exports, then the recordings of its mocks in record mode; each an `export` event. */
export async function runExports(deps: ExportsDeps): Promise<void> {
  const { config, tenant, spec, request, backing, event } = deps;
  const root = config.artifactsDir ?? path.join(config.dataDir, 'artifacts');
  for (const exp of spec.teardown.export) {
    const to = exp.to.replace(/\{\{\s*run_id\s*\}\}/g, request.run_id ?? deps.sandboxId).replace(/\{\{\s*scenario_id\s*\}\}/g, request.scenario_id ?? 'adhoc');
    const target = path.join(root, tenant, to);
    if (!target.startsWith(path.join(root, tenant) + path.sep)) continue;
    await mkdir(path.dirname(target), { recursive: true });
    if (exp.type === 'audit_log') await copyFileOut(deps.box.workspace, `${SERVICE_DIR}/${AUDIT_FILE}`, target).catch(() => writeHostFile(target, ''));
    else if (exp.type === 'snapshot') await writeHostFile(target, JSON.stringify(await deps.capture.captureState()));
    else if (exp.type === 'db_dump') await writeHostFile(target, await (await backing.database(exp.service!)).dump());
    await event('export', { type: exp.type, to });
  }
  // What each mock in record mode saw, as routes a later spec replays.
  for (const service of spec.services) {
    const routes = service.type === 'http_mock' && service.record ? backing.mock(service.name)!.recording() : [];
    if (routes.length === 0) continue;
    const to = path.join('recordings', request.run_id ?? deps.sandboxId, `${service.name}.yaml`);
    if (!path.join(root, tenant, to).startsWith(path.join(root, tenant) + path.sep)) continue;
    await mkdir(path.join(root, tenant, path.dirname(to)), { recursive: true });
    await writeHostFile(path.join(root, tenant, to), stringifyYaml({ routes }));
    await event('export', { type: 'recording', service: service.name, to });
  }
}
