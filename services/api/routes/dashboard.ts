/**
 * The web dashboard at /ui (docs/dashboard.md): the static files that Vite builds from
 * packages/dashboard/ into packages/dashboard/dist/ (`npm run build:ui`, run by `npm install`'s
 * prepare script and by `npm start` when the output is missing). No key is needed for the files:
 * the page asks for the tenant key and sends it as a Bearer header to the public API itself.
 *
 * Caching: `assets/` holds content-hashed file names, so they are `immutable` for a year; every
 * other file, and index.html above all, is `no-cache` (revalidated on each load), so a new build
 * reaches browsers at once. Paths that are not files are the page's own routes: index.html.
 * A strict Content-Security-Policy allows only this origin: the page loads nothing from outside.
 */
import { existsSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { send } from '@koa/send';
import type { Context, Next } from 'koa';
import { AppError } from '../../kernel/errors.ts';

export const DASHBOARD_PREFIX = '/ui';
/** Where the build puts the files (packages/dashboard/vite.config.ts). */
export const DASHBOARD_DIR = fileURLToPath(new URL('../../../packages/dashboard/dist/', import.meta.url));

const YEAR_MS = 365 * 24 * 3600 * 1000;
const SECURITY_HEADERS: Record<string, string> = {
  'Content-Security-Policy':
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'",
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'no-referrer',
};

const isFile = (file: string) => statSync(file, { throwIfNoEntry: false })?.isFile() === true;

/** Middleware serving /ui and everything under it; other paths go on to the API. */
export function dashboard(dir = DASHBOARD_DIR) {
  return async (ctx: Context, next: Next) => {
    if (ctx.path !== DASHBOARD_PREFIX && !ctx.path.startsWith(`${DASHBOARD_PREFIX}/`)) return next();
    if (ctx.method !== 'GET' && ctx.method !== 'HEAD')
      throw new AppError('not_found', `no route ${ctx.method} ${ctx.path}: the dashboard's files are read with GET`);
    if (ctx.path === DASHBOARD_PREFIX) return ctx.redirect(`${DASHBOARD_PREFIX}/`);
    if (!existsSync(path.join(dir, 'index.html'))) {
      throw new AppError('unavailable', 'the dashboard is not built: run `npm run build:ui` (npm install and npm start do it when the build is missing)');
    }
    ctx.set(SECURITY_HEADERS);
    // As requested (send decodes it, within root); the built files have plain ASCII names.
    const rel = ctx.path.slice(DASHBOARD_PREFIX.length + 1);
    if (rel.startsWith('assets/')) {
      await send(ctx, rel, { root: dir, immutable: true, maxage: YEAR_MS, gzip: false, brotli: false });
      return;
    }
    const file = rel !== '' && !rel.split('/').includes('..') && isFile(path.join(dir, rel)) ? rel : 'index.html';
    await send(ctx, file, { root: dir, gzip: false, brotli: false, setHeaders: (res) => res.setHeader('Cache-Control', 'no-cache') });
  };
}
