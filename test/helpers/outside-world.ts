/**
 * "The internet" for the network tests (there is none on a test machine): a network namespace
 * `svco-<6 hex>` joined to the host by a veth (host end `svco<6 hex>`, 10.98.<k>.1/24; the
 * namespace holds 10.98.<k>.2..10), with servers inside it, one address per name:
 *
 *   api.allowed.test    10.98.k.2   HTTP :80, HTTPS :443 (echo, /big?bytes=N, CONNECT proxy)
 *   other.allowed.test  10.98.k.3   same            (also every *.wild.allowed.test)
 *   denied.test         10.98.k.4   same            (so a test can show a request never arrived)
 *   doh.test            10.98.k.5   DNS over HTTPS (RFC 8484 GET and POST /dns-query) on :443 and
 *                                   DNS over TLS on :853, both answering every A with 10.98.k.4;
 *                                   also the echo on :80 and on :443 for other paths
 *   echo.allowed.test   10.98.k.6   TCP echo :7000, UDP echo :7001
 *   (DNS)               10.98.k.10  :53 UDP and TCP, authoritative for the names above,
 *                                   NXDOMAIN for everything else
 *
 * The DNS also answers two kinds of made-up names under the allowed glob, as an attacker's own
 * authoritative server would (TTL 0): `<a-b-c-d>.ip.wild.allowed.test` is a.b.c.d (any address,
 * 169.254.169.254 or 127.0.0.1 say), and `<a-b-c-d>.rebind.wild.allowed.test` is
 * other.allowed.test's address the first time it is asked, a.b.c.d every time after (DNS
 * rebinding).
 *
 * `arrivals(name)` counts what reached a host's address at all, whatever the port and whether
 * a server listens there: TCP connection attempts (SYNs) and UDP datagrams, counted by an
 * nftables table inside the world's namespace (so a test can show that nothing arrived even
 * where no server would have recorded it).
 *
 * With `files`, every web server also serves that directory's files at `/files/<path>` (a
 * package mirror, say).
 *
 * The echo answers `{server, method, host, path, headers, body_bytes, scheme}` as JSON
 * (`?status=NNN` picks the status). Every web server also relays `CONNECT host:port` (names
 * resolved with the table above), so a test can show that a CONNECT through an allowed host was
 * stopped before it arrived. HTTPS and DoT use one certificate for all names, signed by a test
 * CA made with `openssl` in a temp dir (`caFile`).
 *
 * The servers run in a child process (test/helpers/outside-server.ts under `ip netns exec`) that
 * reports over its stdio and exits when its stdin closes, i.e. with the test process. A world
 * whose test process died without close() (SIGKILL) is swept by the next startOutsideWorld():
 * the host link's alias names its owner's pid and start time.
 *
 * Needs root, `ip` and `openssl`.
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdir, rm, stat, writeFile } from 'node:fs/promises';
import { readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { own } from './owned-processes.ts';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, '..', '..');

/** Last octet of each name's address in 10.98.<k>.0/24. */
export const WORLD_HOSTS = {
  'api.allowed.test': 2,
  'other.allowed.test': 3,
  'denied.test': 4,
  'doh.test': 5,
  'echo.allowed.test': 6,
} as const;
/** `*.wild.allowed.test` resolves to other.allowed.test's address. */
export const WILDCARD_SUFFIX = '.wild.allowed.test';
export const WILDCARD_OCTET = 3;
export const DNS_OCTET = 10;
/** The servers that speak HTTP(S). */
export const WEB_HOSTS = ['api.allowed.test', 'other.allowed.test', 'denied.test', 'doh.test'] as const;
export const TCP_ECHO_PORT = 7000;
export const UDP_ECHO_PORT = 7001;
export const DOT_PORT = 853;

/** `<a-b-c-d>.ip.wild.allowed.test` and `<a-b-c-d>.rebind.wild.allowed.test`: the address they name, and how they answer. */
export function madeUpName(name: string): { kind: 'ip' | 'rebind'; address: string } | null {
  const m = /^(\d{1,3})-(\d{1,3})-(\d{1,3})-(\d{1,3})\.(ip|rebind)\.wild\.allowed\.test\.?$/i.exec(name);
  if (!m || m.slice(1, 5).some((o) => Number(o) > 255)) return null;
  return { kind: m[5]!.toLowerCase() as 'ip' | 'rebind', address: m.slice(1, 5).map(Number).join('.') };
}

/** The last octet of `name`'s address, or null when the world's DNS says NXDOMAIN. */
export function worldOctet(name: string): number | null {
  const n = name.toLowerCase().replace(/\.$/, '');
  if (Object.hasOwn(WORLD_HOSTS, n)) return WORLD_HOSTS[n as keyof typeof WORLD_HOSTS];
  if (n.endsWith(WILDCARD_SUFFIX) && n.length > WILDCARD_SUFFIX.length) return WILDCARD_OCTET;
  return null;
}

export interface WorldRequest {
  host: string;
  method: string;
  /** as sent: with the query string; the authority for CONNECT; absolute for proxy-style requests */
  path: string;
  headers: Record<string, string>;
  scheme: 'http' | 'https';
  /** which of the world's servers received it (e.g. 'denied.test'), whatever the Host header says */
  server: string;
  /** request body size, once it has been read */
  body_bytes: number;
}

export interface OutsideWorld {
  /** '10.98.k.10:53', for SVC_DNS_UPSTREAM */
  dns: string;
  /** PEM of the test CA, for SVC_EGRESS_TRUST */
  caFile: string;
  /** the network namespace and the host end of its veth */
  namespace: string;
  hostLink: string;
  /** `name`'s address (a name of the table, or any *.wild.allowed.test); throws for other names */
  ip(name: string): string;
  /** what the web servers (and DoH) received so far */
  requests(): Promise<WorldRequest[]>;
  /** TCP echo connections accepted so far */
  tcpConnections(): Promise<number>;
  /** UDP echo packets received so far */
  udpPackets(): Promise<number>;
  /** what reached `name`'s address so far, any port: TCP connection attempts and UDP datagrams */
  arrivals(name: string): Promise<{ tcp: number; udp: number }>;
  /** questions the world's DNS server received so far, with the asking address */
  dnsQueries(): Promise<Array<{ source: string; name: string; type: string }>>;
  /** DNS-over-TLS queries received so far (DoH ones are in requests()) */
  dotQueries(): Promise<number>;
  /** forgets what was recorded so far (requests, counters, queries, arrivals) */
  reset(): Promise<void>;
  /** kills the servers, deletes the namespace, the veth and the temp dir; idempotent */
  close(): Promise<void>;
}

function run(cmd: string, args: string[], input?: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, args, { encoding: 'utf8', maxBuffer: 16 * 1024 * 1024 }, (err, stdout, stderr) => {
      if (err) reject(Object.assign(new Error(`${cmd} ${args.join(' ')}: ${stderr.trim() || err.message}`), { stderr }));
      else resolve(stdout);
    });
    if (input !== undefined) child.stdin?.end(input);
  });
}

const ip = (...args: string[]) => run('ip', args);
const quiet = (p: Promise<unknown>) =>
  p.then(
    () => undefined,
    () => undefined,
  );

/** The owner tag we put on a world's host link: pid and its start time (pids are reused). */
function ownerTag(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // field 22 (starttime), counted after the ")" that ends the command name
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return `svco-owner=${pid}:${fields[19]}`;
  } catch {
    return null;
  }
}

/** Removes worlds whose test process is gone (killed before close()). */
async function sweepStale(): Promise<void> {
  const links = JSON.parse(await ip('-j', 'link', 'show')) as Array<{ ifname: string; ifalias?: string }>;
  const live = new Set<string>();
  for (const l of links) {
    if (!/^svco[0-9a-f]{6}$/.test(l.ifname)) continue;
    const m = /^svco-owner=(\d+):\d+$/.exec(l.ifalias ?? '');
    if (m && ownerTag(Number(m[1])) === l.ifalias) {
      live.add(l.ifname.slice(4));
      continue;
    }
    if (!m) {
      // no alias yet: being set up right now by another process (its namespace is new), or
      // left by a crash mid-setup
      const st = await stat(`/run/netns/svco-${l.ifname.slice(4)}`).catch(() => null);
      if (st && Date.now() - st.mtimeMs < 60_000) continue;
    }
    await killInside(`svco-${l.ifname.slice(4)}`);
    await quiet(ip('link', 'del', l.ifname));
    await quiet(ip('netns', 'del', `svco-${l.ifname.slice(4)}`));
    await rm(worldDir(l.ifname.slice(4)), { recursive: true, force: true });
  }
  const spaces = (await ip('netns', 'list')).split('\n').map((line) => line.split(' ')[0]);
  for (const ns of spaces) {
    const m = /^svco-([0-9a-f]{6})$/.exec(ns);
    if (!m || live.has(m[1]) || links.some((l) => l.ifname === `svco${m[1]}`)) continue;
    // a namespace without its link: only when old enough not to be a world being set up
    const st = await stat(`/run/netns/${ns}`).catch(() => null);
    if (st && Date.now() - st.mtimeMs > 60_000) {
      await killInside(ns);
      await quiet(ip('netns', 'del', ns));
      await rm(worldDir(m[1]), { recursive: true, force: true });
    }
  }
}

/** Kills what still runs in a stale world's namespace (its servers outlived their test process). */
async function killInside(ns: string): Promise<void> {
  const pids = await ip('netns', 'pids', ns).catch(() => '');
  for (const pid of pids.split('\n').filter(Boolean)) {
    try {
      process.kill(Number(pid), 'SIGKILL');
    } catch {
      // gone
    }
  }
}

/** A world's temp dir (certificates): named by its hex so that a sweep finds it. */
function worldDir(hex: string): string {
  return path.join(os.tmpdir(), `svco-${hex}`);
}

function parseCidr(cidr: string): { base: number; bits: number } | null {
  const m = /^(\d+)\.(\d+)\.(\d+)\.(\d+)(?:\/(\d+))?$/.exec(cidr);
  if (!m) return null;
  const base = ((+m[1] << 24) | (+m[2] << 16) | (+m[3] << 8) | +m[4]) >>> 0;
  return { base, bits: m[5] === undefined ? 32 : +m[5] };
}

/** Whether some host route (other than a default or a very broad one) overlaps 10.98.k.0/24. */
async function subnetTaken(k: number): Promise<boolean> {
  const routes = JSON.parse(await ip('-j', '-4', 'route', 'show', 'table', 'all')) as Array<{ dst: string }>;
  const ours = parseCidr(`10.98.${k}.0/24`)!;
  return routes.some((r) => {
    const c = parseCidr(r.dst);
    if (!c || c.bits < 8) return false;
    const bits = Math.min(c.bits, 24);
    const mask = bits === 0 ? 0 : (~0 << (32 - bits)) >>> 0;
    return (c.base & mask) >>> 0 === (ours.base & mask) >>> 0;
  });
}

async function makeCertificates(dir: string): Promise<{ caFile: string; certFile: string; keyFile: string }> {
  const caKey = path.join(dir, 'ca.key');
  const caFile = path.join(dir, 'ca.pem');
  const keyFile = path.join(dir, 'server.key');
  const csr = path.join(dir, 'server.csr');
  const certFile = path.join(dir, 'server.pem');
  const ext = path.join(dir, 'server.ext');
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  await run('openssl', [
    'req',
    '-x509',
    ...ec,
    '-keyout',
    caKey,
    '-out',
    caFile,
    '-days',
    '2',
    '-subj',
    '/CN=svc outside-world test CA',
    '-addext',
    'basicConstraints=critical,CA:TRUE',
    '-addext',
    'keyUsage=critical,keyCertSign,cRLSign',
  ]);
  await run('openssl', ['req', '-new', ...ec, '-keyout', keyFile, '-out', csr, '-subj', '/CN=api.allowed.test']);
  const names = [...Object.keys(WORLD_HOSTS), `*${WILDCARD_SUFFIX}`].map((n) => `DNS:${n}`).join(',');
  await writeFile(
    ext,
    [
      'basicConstraints=critical,CA:FALSE',
      'keyUsage=critical,digitalSignature,keyEncipherment',
      'extendedKeyUsage=serverAuth',
      `subjectAltName=${names}`,
      '',
    ].join('\n'),
  );
  await run('openssl', [
    'x509',
    '-req',
    '-in',
    csr,
    '-CA',
    caFile,
    '-CAkey',
    caKey,
    '-set_serial',
    `0x${randomBytes(8).toString('hex')}`,
    '-days',
    '2',
    '-extfile',
    ext,
    '-out',
    certFile,
  ]);
  return { caFile, certFile, keyFile };
}

/** Starts the world; see the file's comment. */
export async function startOutsideWorld(options: { files?: string } = {}): Promise<OutsideWorld> {
  await sweepStale().catch(() => undefined);
  const hex = randomBytes(3).toString('hex');
  const namespace = `svco-${hex}`;
  const hostLink = `svco${hex}`;
  const dir = worldDir(hex);
  await mkdir(dir, { mode: 0o700 });
  let child: ChildProcess | null = null;

  const cleanupSync = () => {
    try {
      child?.kill('SIGKILL');
    } catch {
      // gone
    }
    for (const args of [
      ['link', 'del', hostLink],
      ['netns', 'del', namespace],
    ]) {
      try {
        execFileSync('ip', args, { stdio: 'ignore' });
      } catch {
        // already gone
      }
    }
    rmSync(dir, { recursive: true, force: true });
  };
  process.on('exit', cleanupSync);

  let closing: Promise<void> | null = null;
  const close = (): Promise<void> => {
    closing ??= (async () => {
      process.off('exit', cleanupSync);
      if (child && child.exitCode === null && child.signalCode === null) {
        const exited = new Promise<void>((resolve) => child!.once('exit', () => resolve()));
        child.kill('SIGTERM');
        const timer = setTimeout(() => child?.kill('SIGKILL'), 2000);
        await exited;
        clearTimeout(timer);
      }
      // deleting the link takes both ends at once (a namespace's deletion is asynchronous)
      await quiet(ip('link', 'del', hostLink));
      await quiet(ip('netns', 'del', namespace));
      await rm(dir, { recursive: true, force: true });
    })();
    return closing;
  };

  try {
    const certsPromise = makeCertificates(dir);
    await ip('netns', 'add', namespace);
    await ip('link', 'add', hostLink, 'type', 'veth', 'peer', 'name', 'world0', 'netns', namespace);
    const tag = ownerTag(process.pid);
    if (tag) await ip('link', 'set', hostLink, 'alias', tag);
    await ip('link', 'set', hostLink, 'up');

    // claim 10.98.k.0/24: `ip route add` of a prefix that is already routed fails (EEXIST), so
    // two worlds started at once cannot both take the same k
    let k = 0;
    for (let attempt = 0; attempt < 60 && !k; attempt++) {
      const candidate = 1 + Math.floor(Math.random() * 250);
      if (await subnetTaken(candidate)) continue;
      await ip('addr', 'add', `10.98.${candidate}.1/24`, 'dev', hostLink, 'noprefixroute');
      try {
        await ip('route', 'add', `10.98.${candidate}.0/24`, 'dev', hostLink, 'src', `10.98.${candidate}.1`);
        k = candidate;
      } catch {
        await quiet(ip('addr', 'del', `10.98.${candidate}.1/24`, 'dev', hostLink));
      }
    }
    if (!k) throw new Error('outside world: no free 10.98.<k>.0/24');
    const prefix = `10.98.${k}`;
    const octets = [...new Set([...Object.values(WORLD_HOSTS), DNS_OCTET])];
    await run(
      'ip',
      ['-n', namespace, '-batch', '-'],
      [
        'link set lo up',
        ...octets.map((o) => `addr add ${prefix}.${o}/24 dev world0`),
        'link set world0 up',
        `route add default via ${prefix}.1 dev world0`,
        '',
      ].join('\n'),
    );

    // Counters of what reaches each address, any port (arrivals()).
    const counted = octets.map((o) => ({ o, address: `${prefix}.${o}` }));
    await run(
      'ip',
      ['netns', 'exec', namespace, 'nft', '-f', '-'],
      [
        'table inet world {',
        ...counted.flatMap(({ o }) => [`  counter tcp_${o} {}`, `  counter udp_${o} {}`]),
        '  chain input {',
        '    type filter hook input priority filter; policy accept;',
        ...counted.flatMap(({ o, address }) => [
          `    ip daddr ${address} tcp flags & (syn | ack) == syn counter name tcp_${o}`,
          `    ip daddr ${address} meta l4proto udp counter name udp_${o}`,
        ]),
        '  }',
        '}',
        '',
      ].join('\n'),
    );
    const nft = (...args: string[]) => run('ip', ['netns', 'exec', namespace, 'nft', ...args]);

    const certs = await certsPromise;
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      SVCO_CONFIG: JSON.stringify({ prefix, certFile: certs.certFile, keyFile: certs.keyFile, filesDir: options.files }),
    };
    delete env.NODE_TEST_CONTEXT;
    child = own(
      spawn('ip', ['netns', 'exec', namespace, process.execPath, '--import', 'tsx', path.join(HERE, 'outside-server.ts')], {
        cwd: REPO,
        env,
        stdio: ['pipe', 'pipe', 'pipe'],
      }),
    );
    const server = child;
    let stderr = '';
    server.stderr!.setEncoding('utf8');
    server.stderr!.on('data', (d: string) => {
      stderr = (stderr + d).slice(-8000);
    });

    // line protocol: {"ready":true} once, then {"id":n,"result":...} per {"id":n,"op":...}
    const waiting = new Map<number, { resolve: (v: unknown) => void; reject: (e: Error) => void }>();
    let nextId = 1;
    let readyResolve: () => void = () => undefined;
    let readyReject: (e: Error) => void = () => undefined;
    const ready = new Promise<void>((resolve, reject) => {
      readyResolve = resolve;
      readyReject = reject;
    });
    let buffered = '';
    server.stdout!.setEncoding('utf8');
    server.stdout!.on('data', (d: string) => {
      buffered += d;
      let nl: number;
      while ((nl = buffered.indexOf('\n')) >= 0) {
        const line = buffered.slice(0, nl);
        buffered = buffered.slice(nl + 1);
        let msg: { ready?: boolean; id?: number; result?: unknown; error?: string };
        try {
          msg = JSON.parse(line);
        } catch {
          continue;
        }
        if (msg.ready) readyResolve();
        const w = msg.id === undefined ? undefined : waiting.get(msg.id);
        if (w) {
          waiting.delete(msg.id!);
          if (msg.error) w.reject(new Error(msg.error));
          else w.resolve(msg.result);
        }
      }
    });
    server.stdin!.on('error', () => undefined);
    server.on('exit', (code, signal) => {
      const err = new Error(`outside world's servers exited (${signal ?? code}): ${stderr.trim()}`);
      readyReject(err);
      for (const w of waiting.values()) w.reject(err);
      waiting.clear();
    });
    const timer = setTimeout(() => readyReject(new Error(`outside world not ready after 30 s: ${stderr.trim()}`)), 30_000);
    try {
      await ready;
    } finally {
      clearTimeout(timer);
    }

    const ask = <T>(op: string): Promise<T> => {
      if (closing) return Promise.reject(new Error('outside world is closed'));
      const id = nextId++;
      return new Promise<T>((resolve, reject) => {
        waiting.set(id, { resolve: resolve as (v: unknown) => void, reject });
        server.stdin!.write(`${JSON.stringify({ id, op })}\n`);
      });
    };

    return {
      dns: `${prefix}.${DNS_OCTET}:53`,
      caFile: certs.caFile,
      namespace,
      hostLink,
      ip(name: string): string {
        const octet = worldOctet(name);
        if (octet === null) throw new Error(`the outside world has no host named ${name}`);
        return `${prefix}.${octet}`;
      },
      requests: () => ask<WorldRequest[]>('requests'),
      tcpConnections: () => ask<number>('tcpConnections'),
      udpPackets: () => ask<number>('udpPackets'),
      async arrivals(name: string) {
        const octet = worldOctet(name);
        if (octet === null) throw new Error(`the outside world has no host named ${name}`);
        const listed = JSON.parse(await nft('-j', 'list', 'counters', 'table', 'inet', 'world')) as {
          nftables: Array<{ counter?: { name: string; packets: number } }>;
        };
        const packets = (counter: string) => listed.nftables.find((e) => e.counter?.name === counter)?.counter?.packets ?? 0;
        return { tcp: packets(`tcp_${octet}`), udp: packets(`udp_${octet}`) };
      },
      dnsQueries: () => ask<Array<{ source: string; name: string; type: string }>>('dnsQueries'),
      dotQueries: () => ask<number>('dotQueries'),
      reset: async () => {
        await nft('reset', 'counters', 'table', 'inet', 'world');
        await ask<void>('reset');
      },
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}

/**
 * Network resources on the host, for leak tests: links named `svh*` or `svco*`, network
 * namespaces named `svco*`, nft tables named `svc_*` (with `names`, what was counted, to say
 * what leaked). Other test files may create and remove such resources at the same time: compare
 * the names you own rather than only the totals when tests run in parallel.
 */
export async function countNetworkResources(): Promise<{ links: number; netns: number; nftTables: number; names: string[] }> {
  const links = (JSON.parse(await ip('-j', 'link', 'show')) as Array<{ ifname: string }>)
    .map((l) => l.ifname)
    .filter((n) => n.startsWith('svh') || n.startsWith('svco'));
  const netns = (await ip('netns', 'list'))
    .split('\n')
    .map((line) => line.split(' ')[0])
    .filter((n) => n.startsWith('svco'));
  let tables: string[] = [];
  try {
    const listed = JSON.parse(await run('nft', ['-j', 'list', 'tables'])) as { nftables: Array<{ table?: { family: string; name: string } }> };
    tables = listed.nftables.flatMap((e) => (e.table?.name.startsWith('svc_') ? [`${e.table.family} ${e.table.name}`] : []));
  } catch (err) {
    if (!/ENOENT|not found/.test(String(err))) throw err;
  }
  return {
    links: links.length,
    netns: netns.length,
    nftTables: tables.length,
    names: [...links.map((n) => `link ${n}`), ...netns.map((n) => `netns ${n}`), ...tables.map((t) => `nft ${t}`)],
  };
}
