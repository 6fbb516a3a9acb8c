/**
 * What the egress gateway knows of one sandbox (network/gateway.ts): what the runner registers
 * (`SandboxEgress`), what the gateway keeps beside it (`Registered`), and the small questions
 * asked of it everywhere: which backing service a name reaches, whether it may open one more
 * connection, and how a refusal is recorded.
 */
import type { Duplex } from 'node:stream';
import type http from 'node:http';
import type net from 'node:net';
import { normaliseHost, type EgressPolicy } from '../../../domain/egress-policy.ts';

/** What the gateway needs of one sandbox. */
export interface SandboxEgress {
  policy: EgressPolicy;
  /** real hostname -> the name (or address) it resolves to instead */
  dnsOverrides: Record<string, string>;
  /** name -> address the sandbox's /etc/hosts fixes (determinism.dns): where the gateway connects for that name too */
  hosts: Record<string, string>;
  /** audit.http_calls: record every HTTP request, terminating TLS to see HTTPS ones */
  inspect: boolean;
  /** headers set on requests to these hosts (the real value of a brokered secret) */
  brokered: Array<{ hosts: EgressPolicy; header: string; value: string }>;
  record(type: 'http_call' | 'network_denied', details: Record<string, unknown>): void;
  /** the sandbox's backing services */
  services: ServiceEndpoint[];
}

/** Where the sandbox reaches one of its backing services. */
export interface ServiceEndpoint {
  name: string;
  /** its address on the sandbox's network (`serviceAddress`) */
  address: string;
  /** An HTTP service (http_mock) answers the gateway's parsed requests; `host` is the name the request asked for. */
  http?: (req: http.IncomingMessage, res: http.ServerResponse, host: string) => void;
  /** A TCP service (a database): a connection to it, and an observer of each connection's bytes. */
  connect?: () => net.Socket;
  observe?: () => { fromClient(chunk: Buffer): void; fromServer(chunk: Buffer): void; close(): void } | null;
}

/** The address of a sandbox's `index`th backing service: in 198.18.0.0/24 (RFC 2544's benchmarking range, never a real host's); the same in every sandbox. */
export const serviceAddress = (index: number): string => `198.18.0.${index + 1}`;

export interface Registered extends SandboxEgress {
  /** address -> the name it was resolved for */
  resolved: Map<string, string>;
  sockets: Set<Duplex>;
  /** requests the gateway has open upstream for it (pipelined ones too): they count against MAX_CONNECTIONS_PER_SANDBOX */
  inflight: number;
  /** refusals of UDP and DNS already recorded (what -> the second it was recorded in) */
  recent: Map<string, number>;
}

/** How an HTTP connection reached the parser: which sandbox, plain or terminated TLS, the TLS name. */
export interface Via {
  sandbox: Registered;
  scheme: 'http' | 'https';
  port: number;
  serverName: string | null;
}

/** Connections one sandbox may hold through the gateway at once; past it new ones are reset. */
const MAX_CONNECTIONS_PER_SANDBOX = 1024;
export const FULL = `the sandbox holds ${MAX_CONNECTIONS_PER_SANDBOX} connections through the egress gateway, the most it may`;

/**
 * Whether the sandbox may open one more connection through the gateway: its own connections and
 * the requests the gateway has open upstream for it (pipelined ones too) count. Recorded, once a
 * second, when not.
 */
export function room(sandbox: Registered, port: number): boolean {
  if (sandbox.sockets.size + sandbox.inflight < MAX_CONNECTIONS_PER_SANDBOX) return true;
  if (firstThisSecond(sandbox, 'connections')) deny(sandbox, { protocol: 'tcp', host: null, ip: null, port, reason: FULL });
  return false;
}

/** A `network_denied` record; `ip` is null where the name was refused before it resolved. */
export function deny(
  sandbox: Registered,
  details: { protocol: string; host?: string | null; ip?: string | null; port: number; reason: string; [more: string]: unknown },
): void {
  sandbox.record('network_denied', { ...details, host: details.host ?? null, ip: details.ip ?? null });
}

/** The backing service of this name, if any. */
export function serviceNamed(sandbox: Registered, name: string): ServiceEndpoint | undefined {
  return sandbox.services.find((s) => s.name === name);
}

/** The backing service a request's host reaches: by its name, a dns override sending a name to it, or its address. */
export function serviceFor(sandbox: Registered, host: string): ServiceEndpoint | undefined {
  const name = normaliseHost(host);
  return serviceNamed(sandbox, name) ?? serviceNamed(sandbox, overrideOf(sandbox, name) ?? name) ?? sandbox.services.find((s) => s.address === name);
}

/** Where `dns_overrides` sends `name`, if anywhere (its own entries only: `constructor` is no override). */
export function overrideOf(sandbox: Registered, name: string): string | undefined {
  return Object.hasOwn(sandbox.dnsOverrides, name) ? sandbox.dnsOverrides[name] : undefined;
}

/** Whether `what` was not yet refused this second: a flood of datagrams or lookups is not a flood of records. */
export function firstThisSecond(sandbox: Registered, what: string): boolean {
  const second = Math.floor(Date.now() / 1000);
  if (sandbox.recent.get(what) === second) return false;
  if (sandbox.recent.size > 1000) sandbox.recent.clear();
  sandbox.recent.set(what, second);
  return true;
}
