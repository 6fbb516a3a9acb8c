/**
 * The sandbox runner's name, the same across its restarts (SVC_RUNNER_ID, else made once and kept
 * in `<data dir>/runner-id`): its sandboxes and runs are recorded under it, so a runner that comes
 * back ends and cleans up what it left, and the aggregator dispatches its lost runs at once.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { Config } from '../kernel/config.ts';

const NAME = /^[A-Za-z0-9._-]{1,128}$/;

export function runnerIdOf(config: Config): string {
  if (config.runnerId !== null) {
    if (!NAME.test(config.runnerId)) throw new Error(`SVC_RUNNER_ID: must be 1-128 letters, digits, ".", "_" or "-" (got ${JSON.stringify(config.runnerId)})`);
    return config.runnerId;
  }
  const file = path.join(config.dataDir, 'runner-id');
  const kept = () => {
    try {
      const id = fs.readFileSync(file, 'utf8').trim();
      return NAME.test(id) ? id : null;
    } catch {
      return null;
    }
  };
  const existing = kept();
  if (existing) return existing;
  fs.mkdirSync(config.dataDir, { recursive: true });
  const made = `${os
    .hostname()
    .replace(/[^A-Za-z0-9._-]/g, '-')
    .slice(0, 100)}-${randomBytes(4).toString('hex')}`;
  try {
    fs.writeFileSync(file, `${made}\n`, { flag: 'wx' });
    return made;
  } catch {
    // Another process of this data dir made it first.
    const other = kept();
    if (!other) throw new Error(`${file} holds no usable runner id: remove it or set SVC_RUNNER_ID`);
    return other;
  }
}
