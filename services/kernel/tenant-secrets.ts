/**
 * Tenant-stored ("dashboard") secrets: events on the compacted svc.tenant-secrets topic, the
 * value encrypted with AES-256-GCM under the server's secrets key (SVC_SECRETS_KEY, or a key
 * generated once into the data dir), so the log and its copies never hold a plain value.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { Kernel } from './actor.ts';
import { EntityCatalog } from './entity-view.ts';
import { newEventId } from './ids.ts';
import { TOPICS } from './topics.ts';

/** A value of svc.tenant-secrets (schemas/tenant-secret-changed.avsc). */
export interface TenantSecretChanged {
  tenant: string;
  event_id: string;
  ts: number;
  name: string;
  ciphertext: Buffer | null;
}

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

  seal(value: string | Buffer, context: string): Buffer {
    const nonce = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.key, nonce);
    cipher.setAAD(Buffer.from(context));
    return Buffer.concat([nonce, cipher.update(typeof value === 'string' ? Buffer.from(value, 'utf8') : value), cipher.final(), cipher.getAuthTag()]);
  }

  open(blob: Buffer, context: string): string {
    return this.openBytes(blob, context).toString('utf8');
  }

  openBytes(blob: Buffer, context: string): Buffer {
    const decipher = createDecipheriv('aes-256-gcm', this.key, blob.subarray(0, 12));
    decipher.setAAD(Buffer.from(context));
    decipher.setAuthTag(blob.subarray(blob.length - 16));
    return Buffer.concat([decipher.update(blob.subarray(12, blob.length - 16)), decipher.final()]);
  }
}

export class TenantSecrets extends EntityCatalog<TenantSecretChanged> {
  private sealer: Sealer | null = null;

  constructor(kernel: Kernel) {
    super(kernel, TOPICS.tenantSecrets);
  }

  override async start(): Promise<void> {
    this.sealer = new Sealer(secretsKey(this.kernel.config));
    await super.start();
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
    const record: TenantSecretChanged = {
      tenant,
      event_id: newEventId(),
      ts: Date.now(),
      name,
      ciphertext: value === null ? null : this.sealer!.seal(value, id),
    };
    await this.append([{ key: id, tenant, value: record }]);
  }
}

/** Shorter secret values are not redacted: they would turn up everywhere by chance. */
const MIN_REDACTED_CHARS = 4;

/**
 * Replaces every secret value (4+ characters) in text with [REDACTED:<NAME>], longest first (a
 * value holding another goes whole), also where it appears escaped inside JSON text. Text cut
 * short can end with the beginning of a value, which whole-value matching misses: `maxBytes`
 * redacts first and then cuts to that many UTF-8 bytes, and `cut` says the caller's text was
 * already cut at its end (captured output past its limit). Either way, a cut text also loses a
 * tail that begins a secret value. Callers that cut text themselves (chunks) cut what this returned.
 */
export function redactSecrets(text: string, secrets: Record<string, string>, options: { maxBytes?: number; cut?: boolean } = {}): string {
  const forms: Array<[name: string, form: string]> = [];
  for (const [name, value] of Object.entries(secrets)) {
    if (value.length < MIN_REDACTED_CHARS) continue;
    forms.push([name, value]);
    const escaped = JSON.stringify(value).slice(1, -1);
    if (escaped !== value) forms.push([name, escaped]);
  }
  forms.sort((a, b) => b[1].length - a[1].length);
  let out = text;
  for (const [name, form] of forms) if (out.includes(form)) out = out.split(form).join(`[REDACTED:${name}]`);
  let cut = options.cut === true;
  if (options.maxBytes !== undefined) {
    const short = truncateUtf8(out, options.maxBytes);
    cut ||= short.length < out.length;
    out = short;
  }
  if (!cut || forms.length === 0) return out;
  // Bytes decoded across the cut end in U+FFFD, which would hide a value's beginning before it.
  out = out.replace(/\uFFFD+$/, '');
  let tail = 0;
  for (const [, form] of forms) {
    for (let k = Math.min(form.length - 1, out.length); k > tail; k--) {
      if (out.charCodeAt(out.length - k) === form.charCodeAt(0) && out.endsWith(form.slice(0, k))) {
        tail = k;
        break;
      }
    }
  }
  return out.slice(0, out.length - tail);
}

/** Cuts a string to at most `maxBytes` of UTF-8 without splitting a character. */
export function truncateUtf8(value: string, maxBytes: number): string {
  if (value.length * 3 <= maxBytes || Buffer.byteLength(value) <= maxBytes) return value;
  const buf = Buffer.from(value).subarray(0, maxBytes);
  // Drop a partial multi-byte sequence at the end (continuation bytes are 10xxxxxx).
  let end = buf.length;
  let i = end - 1;
  while (i >= 0 && (buf[i] & 0xc0) === 0x80) i--;
  if (i >= 0) {
    const lead = buf[i];
    const need = lead >= 0xf0 ? 4 : lead >= 0xe0 ? 3 : lead >= 0xc0 ? 2 : 1;
    if (end - i < need) end = i;
  }
  return buf.subarray(0, end).toString('utf8');
}
