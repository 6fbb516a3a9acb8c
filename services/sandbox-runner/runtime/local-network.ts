/**
 * The local runtime's side of a sandbox's private network: a veth pair from the sandbox's network
 * namespace to the host, and one nftables table per runner that hands every packet a sandbox sends
 * to the runner's egress gateway (network/gateway.ts) and drops the rest.
 *
 * - Addresses: a /30 per sandbox out of SVC_SANDBOX_NETWORK (host end .1, sandbox .2), at an
 *   offset made of the runner's tag (a hash of its id, so runners on one host do not collide)
 *   and a slot. The host end is named `svh<tag><slot>`, so one wildcard names a runner's links.
 * - The table `svc_<tag>` (family inet): TCP to port 80 goes to the gateway's HTTP port, 443 to its
 *   TLS port, any other TCP to its TCP port, DNS (UDP and TCP 53) to its resolver, any other UDP
 *   to its UDP port; the gateway decides and records. Nothing is forwarded: every connection
 *   that leaves is the gateway's own. Input from a sandbox reaches only those ports; a source
 *   address that does not route back through its link (spoofed) is dropped. Only answers on
 *   connections the host opened (a published ingress port) come back in otherwise.
 * - The sandbox end has no IPv6 address (addrgenmode none): IPv6 fails at once inside.
 *
 * The table is made at start (replacing one a killed runner left, whose links went with their
 * sandboxes' namespaces) and deleted at close; should the runner die first, its launcher deletes
 * it (the launcher's undo).
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { Launcher } from './launcher.ts';

export interface GatewayPorts {
  http: number;
  tls: number;
  tcp: number;
  udp: number;
  dns: number;
}

export interface NetworkSlot {
  /** the host end, `svh<tag><slot>` */
  link: string;
  hostAddress: string;
  sandboxAddress: string;
  slot: number;
}

const SLOTS = 1024;

export class LocalNetworks {
  private readonly tag: string;
  private readonly table: string;
  private readonly base: number;
  private readonly tagBits: number;
  private readonly used = new Set<number>();
  private nextSlot = 0;

  constructor(
    private readonly launcher: Launcher,
    private readonly options: { runnerId: string; range: string; ports: GatewayPorts; stateDir: string },
  ) {
    const { base, prefix } = parseRange(options.range);
    // /30 per sandbox: the range holds 2^(30 - prefix) of them, SLOTS per runner, the rest names the runner.
    this.tagBits = 30 - prefix - Math.log2(SLOTS);
    if (this.tagBits < 0) throw new Error(`SVC_SANDBOX_NETWORK ${options.range} is too small: it needs at least a /${30 - Math.log2(SLOTS)}`);
    this.base = base;
    const hash = createHash('sha256').update(options.runnerId).digest().readUInt32BE(0);
    this.tag = (hash % 2 ** Math.min(this.tagBits, 12)).toString(16).padStart(3, '0');
    this.table = `svc_${this.tag}`;
  }

  /** Replaces what a killed runner of this tag left, and installs this runner's table. */
  async start(): Promise<void> {
    const { ports } = this.options;
    const ifaces = `"svh${this.tag}*"`;
    const rules = [
      `table inet ${this.table} {`,
      `  chain prerouting {`,
      `    type nat hook prerouting priority dstnat - 5; policy accept;`,
      `    iifname ${ifaces} meta l4proto { tcp, udp } th dport 53 redirect to :${ports.dns}`,
      `    iifname ${ifaces} tcp dport 80 redirect to :${ports.http}`,
      `    iifname ${ifaces} tcp dport 443 redirect to :${ports.tls}`,
      `    iifname ${ifaces} meta l4proto tcp redirect to :${ports.tcp}`,
      `    iifname ${ifaces} meta l4proto udp redirect to :${ports.udp}`,
      `  }`,
      `  chain input {`,
      `    type filter hook input priority filter - 5; policy accept;`,
      `    iifname ${ifaces} fib saddr . iif oif missing drop`,
      // Answers on connections the host opened (ingress) come back this way too.
      `    iifname ${ifaces} ct state established,related accept`,
      `    iifname ${ifaces} tcp dport { ${ports.http}, ${ports.tls}, ${ports.tcp}, ${ports.dns} } accept`,
      `    iifname ${ifaces} udp dport { ${ports.dns}, ${ports.udp} } accept`,
      `    iifname ${ifaces} meta l4proto tcp reject with tcp reset`,
      `    iifname ${ifaces} reject with icmpx admin-prohibited`,
      `  }`,
      `  chain forward {`,
      `    type filter hook forward priority filter - 5; policy accept;`,
      `    iifname ${ifaces} reject with icmpx admin-prohibited`,
      `    oifname ${ifaces} reject with icmpx admin-prohibited`,
      `  }`,
      `}`,
    ];
    await fs.promises.mkdir(this.options.stateDir, { recursive: true });
    const file = path.join(this.options.stateDir, `${this.table}.nft`);
    // `add` then `delete`: a table left by a killed runner goes, without an error when there is none.
    await fs.promises.writeFile(file, [`add table inet ${this.table}`, `delete table inet ${this.table}`, ...rules, ''].join('\n'));
    await this.must('nft', ['-f', file], { key: `nft-${this.table}`, command: 'nft', args: ['delete', 'table', 'inet', this.table] });
  }

  /** A free address pair and link name for a sandbox about to start. */
  allocate(): NetworkSlot {
    if (this.used.size >= SLOTS) throw new Error(`no free sandbox network on this runner (${SLOTS} in use)`);
    while (this.used.has(this.nextSlot)) this.nextSlot = (this.nextSlot + 1) % SLOTS;
    const slot = this.nextSlot;
    this.nextSlot = (slot + 1) % SLOTS;
    this.used.add(slot);
    const offset = ((parseInt(this.tag, 16) * SLOTS) + slot) * 4;
    return {
      slot,
      link: `svh${this.tag}${slot.toString(16).padStart(3, '0')}`,
      hostAddress: ipv4(this.base + offset + 1),
      sandboxAddress: ipv4(this.base + offset + 2),
    };
  }

  /** Links the sandbox whose network namespace `pid` is in to the host through `slot`. */
  async attach(slot: NetworkSlot, pid: number, dir: string): Promise<void> {
    const host = path.join(dir, 'net-host.batch');
    const inside = path.join(dir, 'net-sandbox.batch');
    await Promise.all([
      fs.promises.writeFile(host, [
        // A link a crashed sandbox of this slot left (its namespace is gone, the name may linger a moment).
        `link add ${slot.link} type veth peer name eth0 netns ${pid}`,
        `link set dev ${slot.link} addrgenmode none`,
        `addr add ${slot.hostAddress}/30 dev ${slot.link}`,
        `link set ${slot.link} up`,
        '',
      ].join('\n')),
      fs.promises.writeFile(inside, [
        `link set dev eth0 addrgenmode none`,
        `addr add ${slot.sandboxAddress}/30 dev eth0`,
        `link set eth0 up`,
        `route add default via ${slot.hostAddress}`,
        '',
      ].join('\n')),
    ]);
    await this.launcher.run('ip', ['link', 'del', slot.link]).catch(() => undefined);
    await this.must('ip', ['-batch', host]);
    await this.must('nsenter', [`--net=/proc/${pid}/ns/net`, '--', 'ip', '-batch', inside]);
  }

  /** The slot is free again; its link goes with the sandbox's namespace (and is removed here should it linger). */
  async release(slot: NetworkSlot): Promise<void> {
    await this.launcher.run('ip', ['link', 'del', slot.link]);
    this.used.delete(slot.slot);
  }

  async close(): Promise<void> {
    await this.launcher.run('nft', ['delete', 'table', 'inet', this.table]);
    this.launcher.forget(`nft-${this.table}`);
  }

  private async must(command: string, args: string[], undo?: { key: string; command: string; args: string[] }): Promise<void> {
    const result = await this.launcher.run(command, args, { timeoutMs: 10_000, undo });
    if (result.code !== 0) throw new Error(`${command} ${args.join(' ')} failed: ${result.stderr.trim() || `status ${result.code ?? result.signal}`}`);
  }
}

function parseRange(range: string): { base: number; prefix: number } {
  const match = /^(\d+)\.(\d+)\.(\d+)\.(\d+)\/(\d+)$/.exec(range.trim());
  const octets = match?.slice(1, 5).map(Number) ?? [];
  const prefix = Number(match?.[5]);
  if (!match || octets.some((o) => o > 255) || prefix < 8 || prefix > 30) throw new Error(`SVC_SANDBOX_NETWORK: "${range}" is not an IPv4 range such as 100.64.0.0/10`);
  const base = ((octets[0]! << 24) >>> 0) + (octets[1]! << 16) + (octets[2]! << 8) + octets[3]!;
  return { base: base - (base % 2 ** (32 - prefix)), prefix };
}

function ipv4(n: number): string {
  return [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.');
}

/** The original destination of a connection the table redirected to the gateway, from the kernel's connection tracking. */
export async function originalDestination(source: { address: string; port: number }, protocol: 'tcp' | 'udp'): Promise<{ address: string; port: number } | null> {
  const table = await fs.promises.readFile('/proc/net/nf_conntrack', 'utf8').catch(() => '');
  const address = source.address.replace(/^::ffff:/, '');
  const needle = `src=${address} `;
  const sport = `sport=${source.port} `;
  for (const line of table.split('\n')) {
    if (!line.includes(` ${protocol} `) || !line.includes(needle) || !line.includes(sport)) continue;
    const match = /src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)/.exec(line);
    if (match && match[1] === address && Number(match[3]) === source.port) return { address: match[2]!, port: Number(match[4]) };
  }
  return null;
}
