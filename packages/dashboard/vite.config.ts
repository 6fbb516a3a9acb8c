/**
 * The dashboard's build: Preact (JSX through Vite's own transform, no plugin), served under /ui/
 * by the api (services/api/routes/dashboard.ts). Output: dist/index.html and dist/assets/ with
 * content-hashed names, which the api serves as immutable.
 */
import { fileURLToPath } from 'node:url';
import { defineConfig } from 'vite';

export default defineConfig({
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: '/ui/',
  logLevel: 'warn',
  oxc: { jsx: { runtime: 'automatic', importSource: 'preact' } },
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    // One small bundle: no chunk is worth its own request.
    modulePreload: { polyfill: false },
    sourcemap: false,
    target: 'es2022',
  },
});
