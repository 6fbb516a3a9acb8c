/** Reading the sources under services/ for the house's guards (test/unit/layers.test.ts, architecture.test.ts). */
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { REPO } from './server.ts';

export const SERVICES = path.join(REPO, 'services');
const SOURCE = /\.(ts|mts|cts|js|mjs|cjs)$/;

/** Every source file under services/: path relative to services/ (with /) -> its text. */
export function servicesSources(dir = SERVICES, files = new Map<string, string>()): Map<string, string> {
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) {
      if (entry.name !== 'node_modules') servicesSources(full, files);
    } else if (SOURCE.test(entry.name)) {
      files.set(path.relative(SERVICES, full).split(path.sep).join('/'), readFileSync(full, 'utf8'));
    }
  }
  return files;
}

/** The relative import specifiers of a source text: static import/export, import(), require(). */
export function relativeImports(source: string): string[] {
  const found: string[] = [];
  const patterns = [
    /\bfrom\s*(['"])(\.{1,2}\/[^'"]+)\1/g,
    /\bimport\s*\(\s*(['"])(\.{1,2}\/[^'"]+)\1\s*\)/g,
    /\brequire\s*\(\s*(['"])(\.{1,2}\/[^'"]+)\1\s*\)/g,
    /^\s*import\s*(['"])(\.{1,2}\/[^'"]+)\1/gm,
  ];
  for (const pattern of patterns) for (const m of source.matchAll(pattern)) found.push(m[2]);
  return found;
}
