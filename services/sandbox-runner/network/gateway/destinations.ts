/**
 * Where a sandbox's names lead, and whether it may go there: the decision for a name under the
 * sandbox's policy and `dns_overrides`, the addresses a name resolves to for that sandbox
 * (remembered, so that a later connection to the address is known by its name), and the places
 * no sandbox reaches whatever its policy says.
 */
import net from 'node:net';
import os from 'node:os';
import { normaliseHost } from '../../../domain/egress-policy.ts';
import type { UpstreamResolver } from '../dns-server.ts';
import { overrideOf, serviceNamed, type Registered } from './sandbox-egress.ts';

/** Places no sandbox reaches, whatever its policy says. */
const NEVER: Array<[string, net.BlockList]> = [
  [
    'loopback',
    blockList([
      ['127.0.0.0', 8, 'ipv4'],
      ['::1', 128, 'ipv6'],
    ]),
  ],
  [
    'unspecified',
    blockList([
      ['0.0.0.0', 8, 'ipv4'],
      ['::', 128, 'ipv6'],
    ]),
  ],
  [
    'link-local (where clouds serve instance credentials)',
    blockList([
      ['169.254.0.0', 16, 'ipv4'],
      ['fe80::', 10, 'ipv6'],
    ]),
  ],
  [
    'multicast or broadcast',
    blockList([
      ['224.0.0.0', 3, 'ipv4'],
      ['ff00::', 8, 'ipv6'],
    ]),
  ],
];

function blockList(subnets: Array<[string, number, 'ipv4' | 'ipv6']>): net.BlockList {
  const list = new net.BlockList();
  for (const [address, prefix, family] of subnets) list.addSubnet(address, prefix, family);
  return list;
}

/**
 * The decision for a name: allowed by an override or the policy, with the reason. A
 * `dns_overrides` name reaches a backing service on every port (it is the sandbox's own), an
 * outside replacement on 80 and 443 (what an override is for: a web API sent elsewhere) and on
 * the other ports `network.egress` allows for the replacement.
 */
export function decide(sandbox: Registered, host: string, port: number | null): { allowed: boolean; reason: string } {
  const name = normaliseHost(host);
  if (serviceNamed(sandbox, name)) return { allowed: true, reason: `${name} is a backing service of the sandbox` };
  const to = overrideOf(sandbox, name);
  if (to !== undefined) {
    const sends = `network.dns_overrides sends ${name} to ${to}`;
    if (port === null || port === 80 || port === 443 || serviceNamed(sandbox, to)) return { allowed: true, reason: sends };
    const byReplacement = sandbox.policy.decide(to, port);
    return {
      allowed: byReplacement.allowed,
      reason: `${sends}, reached on ports 80 and 443 and otherwise as network.egress allows ${to}: ${byReplacement.reason}`,
    };
  }
  if (port !== null) return sandbox.policy.decide(name, port);
  return sandbox.policy.allowsHost(name)
    ? { allowed: true, reason: `${name} is allowed by network.egress` }
    : { allowed: false, reason: `${name} does not resolve: it matches no entry of network.egress.allow (default ${sandbox.policy.defaultPolicy})` };
}

/** Resolves names for sandboxes and tells the addresses no sandbox reaches. */
export class Destinations {
  private readonly sandboxRanges = new net.BlockList();
  private own = { at: 0, addresses: new Set<string>() };

  constructor(
    readonly upstream: UpstreamResolver,
    sandboxNetwork: string,
  ) {
    const [network, prefix] = sandboxNetwork.split('/');
    this.sandboxRanges.addSubnet(network!, Number(prefix), 'ipv4');
  }

  /** The addresses `host` resolves to for this sandbox (override, literal or upstream); remembered. */
  async resolve(sandbox: Registered, host: string): Promise<string[]> {
    const name = normaliseHost(host);
    if (net.isIP(name)) return [name];
    const target = overrideOf(sandbox, name) ?? name;
    const service = serviceNamed(sandbox, name) ?? serviceNamed(sandbox, target);
    if (service) return [service.address];
    const fixed = sandbox.hosts[target];
    const addresses = net.isIP(target) ? [target] : fixed ? [fixed] : (await this.upstream.lookup4(target)).addresses;
    for (const address of addresses) sandbox.resolved.set(address, name);
    return addresses;
  }

  /** The address to connect to for `host`, or why there is none: it does not resolve, or only to places a sandbox never reaches. */
  async addressFor(sandbox: Registered, host: string): Promise<{ address: string } | { problem: string }> {
    const addresses = await this.resolve(sandbox, host);
    if (addresses.length === 0) return { problem: `${host} does not resolve` };
    const address = addresses.find((a) => this.unreachable(a) === null);
    return address ? { address } : { problem: `${host} resolves to ${addresses[0]}, which is ${this.unreachable(addresses[0]!)}` };
  }

  /**
   * Why a sandbox never reaches `address`, whatever its policy (a name may resolve anywhere, a
   * Host header may be an address): the service host itself, loopback, link-local (where clouds
   * serve instance credentials), multicast, or a sandbox network. Null when it may.
   */
  unreachable(address: string): string | null {
    const family = net.isIP(address) === 6 ? 'ipv6' : 'ipv4';
    if (this.ownAddresses().has(address.replace(/^::ffff:/, ''))) return 'the service host itself: never reachable from a sandbox';
    for (const [what, list] of NEVER) if (list.check(address, family)) return `${what}: never reachable from a sandbox`;
    if (this.sandboxRanges.check(address, family)) return 'a sandbox network: never reachable from a sandbox';
    return null;
  }

  /** The host's own addresses (read again at most once a second: interfaces come and go). */
  private ownAddresses(): Set<string> {
    if (Date.now() - this.own.at > 1000) {
      this.own = { at: Date.now(), addresses: new Set(Object.values(os.networkInterfaces()).flatMap((list) => (list ?? []).map((i) => i.address))) };
    }
    return this.own.addresses;
  }
}
