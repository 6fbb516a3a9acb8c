import fs from 'node:fs';
import path from 'node:path';

/** The absolute path of a host tool (PATH, then the sbin directories), or null when it is not installed. */
export function hostTool(name: string): string | null {
  const dirs = [...(process.env.PATH ?? '').split(path.delimiter), '/usr/sbin', '/sbin', '/usr/bin', '/bin'].filter(Boolean);
  for (const dir of dirs) {
    const file = path.join(dir, name);
    try {
      fs.accessSync(file, fs.constants.X_OK);
      return file;
    } catch {
      // not here
    }
  }
  return null;
}

/** This process's mounts: device (major:minor) and mount point. */
export function mountInfo(): Array<{ device: string; point: string }> {
  return fs
    .readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      const fields = line.split(' ');
      return { device: fields[2]!, point: fields[4]!.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))) };
    });
}

/** This process's mount points. */
export const mountPoints = (): string[] => mountInfo().map((m) => m.point);

/** The host's system directories a sandbox or jail sees read-only: programs, libraries, /etc; nothing of the host's data. */
const HOST_SYSTEM_DIRS = ['/usr', '/etc', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32'];

/** bubblewrap arguments that show the host's system directories read-only (a merged-/usr link as the same link). */
export function hostSystemBinds(): string[] {
  const args: string[] = [];
  for (const dir of HOST_SYSTEM_DIRS) {
    let stat: fs.Stats;
    try {
      stat = fs.lstatSync(dir);
    } catch {
      continue;
    }
    if (stat.isSymbolicLink()) args.push('--symlink', fs.readlinkSync(dir), dir);
    else if (stat.isDirectory()) args.push('--ro-bind', dir, dir);
  }
  return args;
}

/** Whether `file` is in one of the host's system directories (what hostSystemBinds shows). */
export function inHostSystemDirs(file: string): boolean {
  return HOST_SYSTEM_DIRS.some((dir) => file === dir || file.startsWith(`${dir}/`));
}
