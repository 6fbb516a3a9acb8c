/**
 * Tenants and API keys. Both are entities on compacted topics (svc.tenants, svc.api-keys); each
 * process that authenticates requests holds them in EntityViews. Keys are stored as sha256
 * hashes only; the secret is shown once, when it is created or rotated.
 */
import { timingSafeEqual } from 'node:crypto';
import type { Kernel } from './actor.ts';
import { EntityView, latestPerKey } from './entity-view.ts';
import { AppError, badRequest, notFound } from './errors.ts';
import { newEventId, newKeyId, newLiveKey, sha256Hex } from './ids.ts';
import { TOPICS } from './topics.ts';

export type Plan = 'free' | 'pro' | 'enterprise';
export const PLANS: readonly Plan[] = ['free', 'pro', 'enterprise'];

export interface TenantRecord {
  tenant: string;
  event_id: string;
  ts: number;
  plan: Plan;
  max_concurrent_sandboxes: number | null;
  created_at: number;
}

export interface ApiKeyRecord {
  tenant: string;
  event_id: string;
  ts: number;
  key_id: string;
  key_hash: string;
  prefix: string;
  name: string | null;
  status: 'active' | 'revoked';
  created_at: number;
}

/**
 * Who is calling. `admin` is the operator's key from SVC_API_KEY; it acts as the default tenant.
 * `sandbox` is a `svc_sb_` token, valid only for its own sandbox (keyId is the sandbox id).
 * `service` is another process of the deployment (SVC_SERVICE_KEY), valid only for the schema
 * registry; it acts for no tenant (the default one is a placeholder).
 */
export interface Principal {
  kind: 'admin' | 'tenant' | 'anonymous' | 'sandbox' | 'service';
  tenant: string;
  keyId: string;
}

/** Finds the live sandbox of a token hash (the api's sandbox view provides it). */
export type SandboxTokenLookup = (hash: string) => { tenant: string; sandbox_id: string } | undefined;

/**
 * The key from `Bearer <key>`, or from `Basic base64(<any user>:<key>)`, which schema-registry
 * clients send (they only speak Basic auth).
 */
function bearerOrBasicPassword(header: string | undefined): string | undefined {
  const bearer = /^Bearer\s+(\S+)\s*$/i.exec(header ?? '')?.[1];
  if (bearer !== undefined) return bearer;
  const basic = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header ?? '')?.[1];
  if (basic === undefined) return undefined;
  const decoded = Buffer.from(basic, 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon >= 0 && colon < decoded.length - 1 ? decoded.slice(colon + 1) : undefined;
}

/** Constant-time comparison with a configured key (none configured: never equal). */
function sameSecret(token: string, key: Buffer | null): boolean {
  const given = Buffer.from(token);
  return key !== null && given.length === key.length && timingSafeEqual(given, key);
}

const TENANT_NAME = /^[a-z0-9][a-z0-9_-]{0,62}$/;

export class Auth {
  private readonly tenants = new EntityView<TenantRecord>(TOPICS.tenants);
  /** key hash -> key, kept beside the view so a request authenticates in O(1). */
  private readonly byHash = new Map<string, ApiKeyRecord>();
  private readonly keys = new EntityView<ApiKeyRecord>(
    TOPICS.apiKeys,
    latestPerKey((previous, next) => {
      if (previous) this.byHash.delete(previous.key_hash);
      if (next) this.byHash.set(next.key_hash, next);
    }),
  );
  private readonly adminKey: Buffer | null;
  private readonly serviceKey: Buffer | null;
  private sandboxTokens: SandboxTokenLookup = () => undefined;

  constructor(private readonly kernel: Kernel) {
    this.adminKey = kernel.config.apiKey === null ? null : Buffer.from(kernel.config.apiKey);
    this.serviceKey = kernel.config.serviceKey === null ? null : Buffer.from(kernel.config.serviceKey);
  }

  async start(): Promise<void> {
    await Promise.all([this.tenants.start(this.kernel), this.keys.start(this.kernel)]);
  }

  acceptSandboxTokens(lookup: SandboxTokenLookup): void {
    this.sandboxTokens = lookup;
  }

  async stop(): Promise<void> {
    await Promise.all([this.tenants.stop(), this.keys.stop()]);
  }

  /** Resolves the Authorization header; throws 401 for a missing or unknown key. */
  authenticate(header: string | undefined): Principal {
    const { config } = this.kernel;
    const token = bearerOrBasicPassword(header);
    if (token === undefined) {
      if (header === undefined && !config.authRequired) return { kind: 'anonymous', tenant: config.defaultTenant, keyId: 'anonymous' };
      throw new AppError(
        'unauthorized',
        header === undefined ? 'missing API key: send Authorization: Bearer <key>' : 'malformed Authorization header: expected Bearer <key>',
      );
    }
    if (sameSecret(token, this.adminKey)) return { kind: 'admin', tenant: config.defaultTenant, keyId: 'admin' };
    if (sameSecret(token, this.serviceKey)) return { kind: 'service', tenant: config.defaultTenant, keyId: 'service' };
    if (token.startsWith('svc_live_')) {
      const record = this.byHash.get(sha256Hex(token));
      if (record && record.status === 'active') return { kind: 'tenant', tenant: record.tenant, keyId: record.key_id };
    }
    if (token.startsWith('svc_sb_')) {
      const sandbox = this.sandboxTokens(sha256Hex(token));
      if (sandbox) return { kind: 'sandbox', tenant: sandbox.tenant, keyId: sandbox.sandbox_id };
    }
    throw new AppError('unauthorized', 'invalid API key');
  }

  tenant(name: string): TenantRecord | undefined {
    return this.tenants.entities.get(name);
  }

  /** How many sandboxes the tenant may have at once: its custom quota, else its plan's. */
  sandboxQuota(tenant: string): { plan: TenantRecord['plan']; quota: number } {
    const { config } = this.kernel;
    const record = this.tenant(tenant);
    const plan = record?.plan ?? config.defaultPlan;
    const byPlan = { free: config.concurrentSandboxesFree, pro: config.concurrentSandboxesPro, enterprise: config.concurrentSandboxesEnterprise };
    return { plan, quota: record?.max_concurrent_sandboxes ?? byPlan[plan] };
  }

  listTenants(): TenantRecord[] {
    return [...this.tenants.entities.values()].sort((a, b) => a.tenant.localeCompare(b.tenant));
  }

  listKeys(tenant?: string): ApiKeyRecord[] {
    return [...this.keys.entities.values()]
      .filter((k) => tenant === undefined || k.tenant === tenant)
      .sort((a, b) => a.created_at - b.created_at || a.key_id.localeCompare(b.key_id));
  }

  key(keyId: string): ApiKeyRecord {
    const record = this.keys.entities.get(keyId);
    if (!record) throw notFound('API key', keyId);
    return record;
  }

  /** Creates or updates a tenant (plan and custom quota). */
  async putTenant(name: string, changes: { plan?: Plan; max_concurrent_sandboxes?: number | null }): Promise<TenantRecord> {
    if (!TENANT_NAME.test(name)) throw badRequest('tenant', 'must be 1-63 characters of a-z, 0-9, _ and -, starting with a letter or digit');
    const now = Date.now();
    const existing = this.tenants.entities.get(name);
    const record: TenantRecord = {
      tenant: name,
      event_id: newEventId(),
      ts: now,
      plan: changes.plan ?? existing?.plan ?? this.kernel.config.defaultPlan,
      max_concurrent_sandboxes:
        changes.max_concurrent_sandboxes !== undefined ? changes.max_concurrent_sandboxes : (existing?.max_concurrent_sandboxes ?? null),
      created_at: existing?.created_at ?? now,
    };
    await this.tenants.append(this.kernel, [{ key: name, tenant: name, value: record }]);
    return record;
  }

  /** Issues a new key for a tenant (creating the tenant on first use); returns the secret once. */
  /**
   * Creates a key; its secret is shown once. With an idempotent request's `seed`, its id derives
   * from it: a retry after a crash that came after the key was stored finds it, and since its
   * secret cannot be shown again, is refused (409) naming it, rather than making a second key.
   */
  async createKey(tenant: string, name: string | null, seed: string | null = null): Promise<{ record: ApiKeyRecord; secret: string }> {
    const keyId = newKeyId(seed);
    if (seed !== null && this.keys.entities.has(keyId)) {
      throw new AppError(
        'conflict',
        `the key this request made, ${keyId}, exists; its secret was shown only in the lost answer: rotate it (POST /v1/admin/keys/${keyId}/rotate) or revoke it`,
      );
    }
    if (!this.tenants.entities.has(tenant)) await this.putTenant(tenant, {});
    return this.writeKey({ keyId, tenant, name, createdAt: Date.now() });
  }

  /** Replaces a key's secret: the old one stops working as soon as this returns. */
  async rotateKey(keyId: string): Promise<{ record: ApiKeyRecord; secret: string }> {
    const existing = this.key(keyId);
    if (existing.status !== 'active') throw new AppError('conflict', `API key ${keyId} is revoked and cannot be rotated`);
    return this.writeKey({ keyId, tenant: existing.tenant, name: existing.name, createdAt: existing.created_at });
  }

  async revokeKey(keyId: string): Promise<ApiKeyRecord> {
    const existing = this.key(keyId);
    const record: ApiKeyRecord = { ...existing, event_id: newEventId(), ts: Date.now(), status: 'revoked' };
    await this.appendKey(record);
    return record;
  }

  private async writeKey(k: { keyId: string; tenant: string; name: string | null; createdAt: number }) {
    const secret = newLiveKey();
    const record: ApiKeyRecord = {
      tenant: k.tenant,
      event_id: newEventId(),
      ts: Date.now(),
      key_id: k.keyId,
      key_hash: sha256Hex(secret),
      prefix: secret.slice(0, 13),
      name: k.name,
      status: 'active',
      created_at: k.createdAt,
    };
    await this.appendKey(record);
    return { record, secret };
  }

  private async appendKey(record: ApiKeyRecord): Promise<void> {
    await this.keys.append(this.kernel, [{ key: record.key_id, tenant: record.tenant, value: record }]);
  }
}
