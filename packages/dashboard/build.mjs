#!/usr/bin/env node
// Builds the dashboard (Vite) into packages/dashboard/dist when its sources changed since the
// last build (a hash of them is kept in dist/.source-hash), so `npm install` (prepare),
// `npm start` (prestart) and the tests can all call it: it costs a hash when nothing changed.
//   node packages/dashboard/build.mjs           build when stale
//   node packages/dashboard/build.mjs --force   build anyway
// Without Vite (a production install, `npm ci --omit=dev`) it says so and exits 0 when a build
// is already there: the service then serves that build, or answers /ui with a 503 saying how.
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const dist = path.join(here, 'dist');
const stampFile = path.join(dist, '.source-hash');

function sourceHash() {
  const hash = createHash('sha256');
  // The page bundles the SDK's client too (src/api.ts): a change there is a change of the page.
  const under = (dir) => readdirSync(path.join(here, dir), { recursive: true }).map((f) => path.join(dir, String(f)));
  const files = ['index.html', 'vite.config.ts', ...under('src'), ...under('../sdk/src')].sort();
  for (const file of files) {
    const full = path.join(here, file);
    if (!existsSync(full) || !/\.(html|ts|tsx|css|svg)$/.test(file)) continue;
    hash.update(file).update('\0').update(readFileSync(full)).update('\0');
  }
  const vite = path.join(here, '..', '..', 'node_modules', 'vite', 'package.json');
  if (existsSync(vite)) hash.update(JSON.parse(readFileSync(vite, 'utf8')).version);
  return hash.digest('hex');
}

const force = process.argv.includes('--force');
const wanted = sourceHash();
const built = existsSync(stampFile) ? readFileSync(stampFile, 'utf8').trim() : null;
if (!force && built === wanted && existsSync(path.join(dist, 'index.html'))) process.exit(0);

let vite;
try {
  vite = await import('vite');
} catch {
  const have = existsSync(path.join(dist, 'index.html'));
  console.error(
    `dashboard: vite is not installed (a production install?); ${have ? 'serving the existing build' : '/ui will answer 503 until `npm install && npm run build:ui`'}`,
  );
  process.exit(0);
}
const started = Date.now();
await vite.build({ configFile: path.join(here, 'vite.config.ts'), logLevel: 'warn' });
writeFileSync(stampFile, `${wanted}\n`);
console.error(`dashboard: built into ${path.relative(process.cwd(), dist) || dist} in ${Date.now() - started} ms`);
