/**
 * What a spec uses that this server cannot execute yet (docs/decisions.md, "Features that
 * arrive later": the spec is stored; creating a sandbox or running an experiment from it is
 * refused, naming the capability and where it is used). A sandbox needs its environment; a run also needs the checks and forbidden rules.
 */
import { AppError } from '../kernel/errors.ts';
import type { SpecDocument } from './spec.ts';

function unsupportedCapabilities(doc: SpecDocument, use: 'sandbox' | 'run'): string[] {
  const found: string[] = [];
  const add = (what: string, where: string[]) => where.length > 0 && found.push(`${what} (${where.join(', ')})`);
  add('backing services', doc.services.map((s) => `services.${s.name}`));
  for (const type of ['sql', 'git', 'drift'] as const) {
    add(`fixtures of type ${type}`, doc.fixtures.flatMap((f, i) => (f.type === type ? [`fixtures[${i}]`] : [])));
  }
  // The network block (egress, ingress, dns_overrides) and brokered secrets run: the sandbox network.
  if (use === 'run') {
    for (const type of ['sql', 'http_mock_assertions'] as const) {
      add(`${type} invariants`, Object.entries(doc.invariants).flatMap(([name, inv]) => (inv.check.type === type ? [`invariants.${name}`] : [])));
    }
    // http_except is scored from the http_call records of audit.http_calls; db_writes_outside needs the database proxy.
    add('the forbidden rule db_writes_outside', doc.forbidden.db_writes_outside !== undefined ? ['forbidden.db_writes_outside'] : []);
  }
  return found;
}

/** A 400 naming what the spec uses that cannot run yet (after `field: ` when the request named the spec in one). */
export function refuseUnsupported(doc: SpecDocument, use: 'sandbox' | 'run', field?: string): void {
  const found = unsupportedCapabilities(doc, use);
  if (found.length > 0) throw new AppError('bad_request', `${field ? `${field}: ` : ''}spec "${doc.id}" uses ${found.join(', ')}, which this server cannot run yet`);
}
