/**
 * Tenant-stored ("dashboard") secrets: events on the compacted svc.tenant-secrets topic, the
 * value encrypted with AES-256-GCM under the server's secrets key (SVC_SECRETS_KEY, or a key
 * generated once into the data dir), so the log and its copies never hold a plain value.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { publish, type Kernel } from './actor.ts';
import { EntityView } from './entity-view.ts';
import type { TenantSecretChanged } from './events.ts';
import { newEventId } from './ids.ts';
import { TOPICS } from './topics.ts';

/** The 32-byte key: from SVC_SECRETS_KEY, else created once in the data dir (mode 0600). */
export function secretsKey(config: Kernel['config']): Buffer {
  if (config.secretsKey) return Buffer.from(config.secretsKey, 'hex');
  const file = path.join(config.dataDir, 'secrets.key');
  if (!existsSync(file)) writeFileSync(file, randomBytes(32).toString('hex'), { mode: 0o600, flag: 'wx' });
  return Buffer.from(readFileSync(file, 'utf8').trim(), 'hex');
}

/**
 * AES-256-GCM under the secrets key, bound to a context string (the AAD) so a sealed value
 * cannot be replayed as another: 12-byte nonce, ciphertext, 16-byte tag.
 */
export class Sealer {
  constructor(private readonly key: Buffer) {}

  seal(value: string, context: string): Buffer {
    const nonce = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.key, nonce);
    cipher.setAAD(Buffer.from(context));
    return Buffer.concat([nonce, cipher.update(value, 'utf8'), cipher.final(), cipher.getAuthTag()]);
  }

  open(blob: Buffer, context: string): string {
    const decipher = createDecipheriv('aes-256-gcm', this.key, blob.subarray(0, 12));
    decipher.setAAD(Buffer.from(context));
    decipher.setAuthTag(blob.subarray(blob.length - 16));
    return Buffer.concat([decipher.update(blob.subarray(12, blob.length - 16)), decipher.final()]).toString('utf8');
  }
}

export class TenantSecrets {
  private readonly view = new EntityView<TenantSecretChanged>(TOPICS.tenantSecrets);
  private sealer: Sealer | null = null;

  constructor(private readonly kernel: Kernel) {}

  async start(): Promise<void> {
    this.sealer = new Sealer(secretsKey(this.kernel.config));
    await this.view.start(this.kernel);
  }

  stop(): Promise<void> {
    return this.view.stop();
  }

  list(tenant: string): Array<{ name: string; updated_at: string }> {
    return [...this.view.entities.values()]
      .filter((s) => s.tenant === tenant && s.ciphertext !== null)
      .map((s) => ({ name: s.name, updated_at: new Date(s.ts).toISOString() }))
      .sort((a, b) => a.name.localeCompare(b.name));
  }

  /** The tenant's secrets in plain text, for a sandbox boot. */
  values(tenant: string): Record<string, string> {
    const out: Record<string, string> = {};
    for (const s of this.view.entities.values()) {
      if (s.tenant === tenant && s.ciphertext !== null) out[s.name] = this.sealer!.open(s.ciphertext, `${tenant}/${s.name}`);
    }
    return out;
  }

  has(tenant: string, name: string): boolean {
    return this.view.entities.get(`${tenant}/${name}`)?.ciphertext != null;
  }

  async put(tenant: string, name: string, value: string | null): Promise<void> {
    const id = `${tenant}/${name}`;
    const record: TenantSecretChanged = { tenant, event_id: newEventId(), ts: Date.now(), name, ciphertext: value === null ? null : this.sealer!.seal(value, id) };
    const positions = await publish(this.kernel, TOPICS.tenantSecrets, [{ key: id, tenant, value: record }]);
    await this.view.waitFor(positions, this.kernel.config.replyTimeout);
  }
}

/** Replaces every secret value (4+ characters) in text with [REDACTED:<NAME>]. */
export function redactSecrets(text: string, secrets: Record<string, string>): string {
  let out = text;
  for (const [name, value] of Object.entries(secrets)) {
    if (value.length >= 4 && out.includes(value)) out = out.split(value).join(`[REDACTED:${name}]`);
  }
  return out;
}
