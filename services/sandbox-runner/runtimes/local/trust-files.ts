/**
 * The files of a networked sandbox's trust store (CreateSandboxOptions.network.trust): the root's
 * system CA bundle plus the deployment's CA, and that CA alone, written on the host once per root
 * and bound into the sandbox at TRUST_IN_SANDBOX (and over the system's bundle, where the root has one).
 */
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

/** Where Debian-like roots keep the system's CA bundle (the sandbox's gets the deployment's CA added). */
export const SYSTEM_TRUST_BUNDLE = 'etc/ssl/certs/ca-certificates.crt';
/** Where update-ca-certificates finds local authorities: in a writable root, the bundles it makes keep the deployment's CA. */
export const LOCAL_TRUST_AUTHORITY = 'usr/local/share/ca-certificates/svc-egress-ca.crt';

export interface TrustStore {
  bundle: string;
  authority: string;
  /** the root has a system bundle: `bundle` is that bundle plus the CA */
  overSystem: boolean;
}

export class TrustFiles {
  private readonly written = new Map<string, Promise<TrustStore>>();

  /** @param dir where the files are written (the runtime's state directory's `trust`) */
  constructor(private readonly dir: string) {}

  /** The root's system bundle plus the deployment's CA, and the CA alone: written once per root (and version of its bundle). */
  of(root: string, trust: string): Promise<TrustStore> {
    const stat = fs.lstatSync(path.join(root, SYSTEM_TRUST_BUNDLE), { throwIfNoEntry: false });
    const key = createHash('sha256').update(`${root}\0${stat?.size}\0${stat?.mtimeMs}\0${trust}`).digest('hex').slice(0, 16);
    let files = this.written.get(key);
    if (!files) {
      files = (async () => {
        await fs.promises.mkdir(this.dir, { recursive: true });
        const system = await readInside(root, SYSTEM_TRUST_BUNDLE);
        const bundle = path.join(this.dir, `${key}.crt`);
        const authority = path.join(this.dir, `${key}.ca.pem`);
        await fs.promises.writeFile(bundle, `${system ?? ''}${system && !system.endsWith('\n') ? '\n' : ''}${trust}\n`, { mode: 0o644 });
        await fs.promises.writeFile(authority, `${trust}\n`, { mode: 0o644 });
        return { bundle, authority, overSystem: system !== null && stat?.isFile() === true };
      })();
      files.catch(() => this.written.delete(key));
      this.written.set(key, files);
    }
    return files;
  }
}

/** A regular file of the root at `relative`, read only when nothing on the way leads out of the root (an image may plant links). */
async function readInside(root: string, relative: string): Promise<string | null> {
  const real = await fs.promises.realpath(path.join(root, relative)).catch(() => null);
  if (real === null || (root !== '/' && !real.startsWith(`${path.resolve(root)}/`))) return null;
  const stat = await fs.promises.lstat(real);
  return stat.isFile() && stat.size < 16 * 1024 ** 2 ? fs.promises.readFile(real, 'utf8') : null;
}
