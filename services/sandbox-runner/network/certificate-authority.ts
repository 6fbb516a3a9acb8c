/**
 * The deployment's certificate authority for HTTPS interception (spec DECISIONS.md, "Network":
 * the sandbox trusts it through the system store, SSL_CERT_FILE, NODE_EXTRA_CA_CERTS and
 * REQUESTS_CA_BUNDLE). The egress proxy terminates a sandbox's TLS with a leaf certificate this
 * CA signs for the name the client asked for (SNI, or the destination IP), so `http_call` records
 * can be made for HTTPS too.
 *
 * Where the CA comes from:
 * - the operator's settings (`certFile` + `keyFile`, PEM; the key EC P-256/384/521 or RSA, in
 *   PKCS#8, SEC1 or PKCS#1 form, unencrypted): used as they are, after checking the certificate
 *   is a CA and the key is its key. The first certificate of `certFile` signs; if it is not
 *   self-signed (an intermediate), it is sent after the leaf so clients trusting the root accept;
 * - otherwise `<dir>/ca.pem` + `<dir>/ca-key.pem`, generated on the first start (ECDSA P-256,
 *   CN "svc sandbox egress CA", 10 years, key file 0600) and reused afterwards. Two processes
 *   starting at once agree on one pair: each file is written to a temporary name and hard-linked
 *   into place (the link fails if the name exists), the key first; whoever finds a key without a
 *   certificate makes the certificate for that key, and everyone re-reads what won.
 *
 * Leaves: one ECDSA P-256 key pair per process for every leaf; per name a certificate valid from
 * an hour ago for 7 days (never past the CA), SAN exactly that DNS name or IP, serverAuth only, a
 * random serial. The `tls.SecureContext`s are cached (LRU of 1,000 names, each reused for a day)
 * and concurrent requests for one name share one signing.
 */
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import crypto, { webcrypto } from 'node:crypto';
import { link, mkdir, open, readFile, unlink } from 'node:fs/promises';
import net from 'node:net';
import path from 'node:path';
import tls from 'node:tls';

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

export const CA_COMMON_NAME = 'svc sandbox egress CA';
export const CA_CERT_FILE = 'ca.pem';
export const CA_KEY_FILE = 'ca-key.pem';

const HOUR_MS = 3_600_000;
const DAY_MS = 24 * HOUR_MS;
const CA_VALIDITY_MS = 3_652 * DAY_MS; // 10 years, leap days included
const LEAF_BACKDATE_MS = HOUR_MS;
const LEAF_VALIDITY_MS = 7 * DAY_MS;
/** A cached context is replaced after this long, well before its certificate expires. */
const LEAF_REUSE_MS = DAY_MS;
const CACHE_SIZE = 1_000;

interface Issuer {
  /** The certificate(s) the sandbox trusts, PEM. */
  certPem: string;
  /** Sent after each leaf: the signing certificate when it is an intermediate, else ''. */
  chainPem: string;
  cert: x509.X509Certificate;
  signingKey: webcrypto.CryptoKey;
  signingAlgorithm: Algorithm | EcdsaParams;
  notAfter: Date;
  /** The CA's subject key identifier (hex), for the leaves' authority key identifier. */
  keyId: string | null;
}

interface CacheEntry {
  context: Promise<tls.SecureContext>;
  madeAt: number;
}

export class CertificateAuthority {
  readonly certPem: string;
  readonly #issuer: Issuer;
  /** Insertion order is recency order: a hit moves its entry to the end. */
  readonly #cache = new Map<string, CacheEntry>();

  private constructor(issuer: Issuer) {
    this.#issuer = issuer;
    this.certPem = issuer.certPem;
  }

  /** The operator's CA when both files are given, else the one kept in `dir` (made once). */
  static async open(options: { dir: string; certFile?: string | null; keyFile?: string | null }): Promise<CertificateAuthority> {
    const { certFile, keyFile } = options;
    if (Boolean(certFile) !== Boolean(keyFile)) throw new Error('certificate authority: give both a certificate file and a key file, or neither');
    const pair = certFile && keyFile ? await readOperatorPair(certFile, keyFile) : await openKeptPair(options.dir);
    return new CertificateAuthority(await issuerOf(pair.certPem, pair.keyPem, pair.label));
  }

  /**
   * A server context presenting a leaf for `hostname` (a DNS name or an IP literal); rejects for
   * a name no leaf is made for (see normalizeHostname).
   */
  secureContextFor(hostname: string): Promise<tls.SecureContext> {
    let name: string;
    try {
      name = normalizeHostname(hostname);
    } catch (err) {
      return Promise.reject(err);
    }
    const now = Date.now();
    const hit = this.#cache.get(name);
    if (hit) {
      this.#cache.delete(name);
      if (now - hit.madeAt < LEAF_REUSE_MS) {
        this.#cache.set(name, hit);
        return hit.context;
      }
    }
    const entry: CacheEntry = { context: this.#makeContext(name), madeAt: now };
    entry.context.catch(() => {
      if (this.#cache.get(name) === entry) this.#cache.delete(name);
    });
    this.#cache.set(name, entry);
    while (this.#cache.size > CACHE_SIZE) this.#cache.delete(this.#cache.keys().next().value!);
    return entry.context;
  }

  async #makeContext(name: string): Promise<tls.SecureContext> {
    const leafKeys = await processLeafKeys();
    const issuer = this.#issuer;
    const notBefore = new Date(Date.now() - LEAF_BACKDATE_MS);
    const notAfter = new Date(Math.min(notBefore.getTime() + LEAF_VALIDITY_MS, issuer.notAfter.getTime()));
    const isIp = net.isIP(name) !== 0;
    const extensions: x509.Extension[] = [
      new x509.BasicConstraintsExtension(false, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth], false),
      new x509.SubjectAlternativeNameExtension([{ type: isIp ? 'ip' : 'dns', value: name }], false),
    ];
    if (issuer.keyId) extensions.push(new x509.AuthorityKeyIdentifierExtension(issuer.keyId, false));
    const leaf = await x509.X509CertificateGenerator.create({
      serialNumber: randomSerial(),
      subject: [{ CN: [name] }],
      issuer: issuer.cert.subjectName,
      notBefore,
      notAfter,
      publicKey: leafKeys.publicSpki,
      signingKey: issuer.signingKey,
      signingAlgorithm: issuer.signingAlgorithm,
      extensions,
    });
    return tls.createSecureContext({ key: leafKeys.privatePem, cert: leaf.toString('pem') + '\n' + issuer.chainPem });
  }
}

// ---------------------------------------------------------------------------------------------
// Names

const LABEL = /^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$/;

/**
 * The name a leaf is made for: an IP literal as it is, or a DNS name lowercased without a final
 * dot. Throws for anything else (wildcards, empty or over-long names and labels, other chars).
 */
export function normalizeHostname(hostname: string): string {
  if (typeof hostname !== 'string' || hostname.length === 0) throw new Error('certificate authority: empty hostname');
  if (net.isIPv4(hostname)) return hostname;
  if (net.isIPv6(hostname) && !hostname.includes('%')) return hostname.toLowerCase();
  let name = hostname.toLowerCase();
  if (name.endsWith('.')) name = name.slice(0, -1);
  const bad = (why: string) => new Error(`certificate authority: invalid hostname ${JSON.stringify(hostname.slice(0, 300))}: ${why}`);
  if (name.length === 0 || name.length > 253) throw bad('length must be 1 to 253');
  if (name.includes('*')) throw bad('wildcards are not issued');
  const labels = name.split('.');
  for (const label of labels) if (!LABEL.test(label)) throw bad(`bad label ${JSON.stringify(label.slice(0, 70))}`);
  if (/^[0-9]+$/.test(labels[labels.length - 1])) throw bad('an all-numeric last label is not a hostname');
  return name;
}

// ---------------------------------------------------------------------------------------------
// Leaf keys and serials

interface LeafKeys {
  publicSpki: ArrayBuffer;
  privatePem: string;
}

let leafKeys: Promise<LeafKeys> | null = null;

/** The one leaf key pair of this process. */
function processLeafKeys(): Promise<LeafKeys> {
  leafKeys ??= (async () => {
    const pair = await webcrypto.subtle.generateKey({ name: 'ECDSA', namedCurve: 'P-256' }, true, ['sign', 'verify']);
    const publicSpki = await webcrypto.subtle.exportKey('spki', pair.publicKey);
    const privatePem = crypto.KeyObject.from(pair.privateKey).export({ type: 'pkcs8', format: 'pem' }) as string;
    return { publicSpki, privatePem };
  })();
  leafKeys.catch(() => (leafKeys = null));
  return leafKeys;
}

/** 16 random bytes, positive and without a leading zero byte. */
function randomSerial(): string {
  const bytes = crypto.randomBytes(16);
  bytes[0] = (bytes[0] & 0x7f) | 0x01;
  return bytes.toString('hex');
}

// ---------------------------------------------------------------------------------------------
// The CA's certificate and key

interface PemPair {
  certPem: string;
  keyPem: string;
  /** Where the pair came from, for error messages. */
  label: string;
}

const CERT_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

async function readOperatorPair(certFile: string, keyFile: string): Promise<PemPair> {
  const [certPem, keyPem] = await Promise.all([readFile(certFile, 'utf8'), readFile(keyFile, 'utf8')]);
  return { certPem, keyPem, label: `${certFile} and ${keyFile}` };
}

/** Checks the pair and imports the key for signing. */
async function issuerOf(certText: string, keyPem: string, label: string): Promise<Issuer> {
  const fail = (why: string, cause?: unknown) => new Error(`certificate authority (${label}): ${why}`, { cause });
  const blocks: string[] = certText.match(CERT_BLOCK) ?? [];
  const first = blocks[0];
  if (first === undefined) throw fail('no PEM certificate found');
  let nodeCert: crypto.X509Certificate;
  let privateKey: crypto.KeyObject;
  try {
    nodeCert = new crypto.X509Certificate(first);
  } catch (err) {
    throw fail('the certificate does not parse', err);
  }
  try {
    privateKey = crypto.createPrivateKey(keyPem);
  } catch (err) {
    throw fail('the private key does not parse (PEM, unencrypted)', err);
  }
  if (!nodeCert.ca) throw fail('the certificate is not a CA (basicConstraints CA:TRUE)');
  if (!nodeCert.checkPrivateKey(privateKey)) throw fail('the private key is not the key of the certificate');
  const notAfter = new Date(nodeCert.validTo);
  if (!(notAfter.getTime() > Date.now())) throw fail(`the certificate expired on ${nodeCert.validTo}`);
  const { importAlgorithm, signingAlgorithm } = signingAlgorithmOf(privateKey, fail);
  const der = privateKey.export({ type: 'pkcs8', format: 'der' });
  const signingKey = await webcrypto.subtle.importKey('pkcs8', der, importAlgorithm, false, ['sign']);
  const cert = new x509.X509Certificate(first);
  const ski = cert.getExtension(x509.SubjectKeyIdentifierExtension);
  const selfSigned = nodeCert.issuer === nodeCert.subject && nodeCert.verify(nodeCert.publicKey);
  return {
    certPem: blocks.join('\n') + '\n',
    chainPem: selfSigned ? '' : first + '\n',
    cert,
    signingKey,
    signingAlgorithm,
    notAfter,
    keyId: ski ? ski.keyId : null,
  };
}

const CURVES: Record<string, { curve: string; hash: string }> = {
  prime256v1: { curve: 'P-256', hash: 'SHA-256' },
  secp384r1: { curve: 'P-384', hash: 'SHA-384' },
  secp521r1: { curve: 'P-521', hash: 'SHA-512' },
};

function signingAlgorithmOf(key: crypto.KeyObject, fail: (why: string) => Error) {
  if (key.asymmetricKeyType === 'ec') {
    const curve = CURVES[key.asymmetricKeyDetails?.namedCurve ?? ''];
    if (!curve) throw fail(`unsupported EC curve ${key.asymmetricKeyDetails?.namedCurve}`);
    return { importAlgorithm: { name: 'ECDSA', namedCurve: curve.curve }, signingAlgorithm: { name: 'ECDSA', hash: curve.hash } };
  }
  if (key.asymmetricKeyType === 'rsa') {
    const alg = { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' };
    return { importAlgorithm: alg, signingAlgorithm: alg };
  }
  throw fail(`unsupported key type ${key.asymmetricKeyType} (EC or RSA)`);
}

/** `<dir>/ca.pem` + `<dir>/ca-key.pem`, made if missing; safe against other processes doing the same. */
async function openKeptPair(dir: string): Promise<PemPair> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const certPath = path.join(dir, CA_CERT_FILE);
  const keyPath = path.join(dir, CA_KEY_FILE);
  let keyPem = await readIfExists(keyPath);
  if (keyPem === null) {
    const pair = await webcrypto.subtle.generateKey({ name: 'ECDSA', namedCurve: 'P-256' }, true, ['sign', 'verify']);
    const pem = crypto.KeyObject.from(pair.privateKey).export({ type: 'pkcs8', format: 'pem' }) as string;
    await publishOnce(keyPath, pem, 0o600);
    keyPem = (await readIfExists(keyPath))!;
  }
  // A key without a certificate: another process is making it right now, or crashed before it
  // did. Make one for that key; if another link wins, its certificate is for the same key.
  let certPem = await readIfExists(certPath);
  if (certPem === null) {
    await publishOnce(certPath, await selfSignedFor(keyPem, keyPath), 0o644);
    certPem = (await readIfExists(certPath))!;
  }
  return { certPem, keyPem, label: `${certPath} and ${keyPath}` };
}

/** A new self-signed CA certificate for the key in `keyPem`. */
async function selfSignedFor(keyPem: string, keyPath: string): Promise<string> {
  let keyObject: crypto.KeyObject;
  try {
    keyObject = crypto.createPrivateKey(keyPem);
  } catch (err) {
    throw new Error(`certificate authority: ${keyPath} does not parse`, { cause: err });
  }
  const { importAlgorithm, signingAlgorithm } = signingAlgorithmOf(keyObject, (why) => new Error(`certificate authority (${keyPath}): ${why}`));
  const signingKey = await webcrypto.subtle.importKey('pkcs8', keyObject.export({ type: 'pkcs8', format: 'der' }), importAlgorithm, false, ['sign']);
  const publicSpki = crypto.createPublicKey(keyObject).export({ type: 'spki', format: 'der' });
  const name = [{ CN: [CA_COMMON_NAME] }];
  const notBefore = new Date(Date.now() - LEAF_BACKDATE_MS);
  const publicKey = await x509.PublicKey.create(new Uint8Array(publicSpki));
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: randomSerial(),
    subject: name,
    issuer: name,
    notBefore,
    notAfter: new Date(notBefore.getTime() + CA_VALIDITY_MS),
    publicKey,
    signingKey,
    signingAlgorithm,
    extensions: [
      new x509.BasicConstraintsExtension(true, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(publicKey),
    ],
  });
  return cert.toString('pem') + '\n';
}

async function readIfExists(file: string): Promise<string | null> {
  try {
    return await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}

/**
 * Writes `text` to `file` unless it exists, all or nothing: a synced temporary file hard-linked
 * to the name (a link never replaces). Losing the race to another writer is not an error.
 */
async function publishOnce(file: string, text: string, mode: number): Promise<void> {
  const temp = `${file}.${process.pid}.${crypto.randomBytes(6).toString('hex')}.tmp`;
  const handle = await open(temp, 'wx', mode);
  try {
    await handle.writeFile(text);
    await handle.chmod(mode);
    await handle.sync();
  } finally {
    await handle.close();
  }
  try {
    await link(temp, file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  } finally {
    await unlink(temp).catch(() => {});
  }
}
