#!/usr/bin/env node
// The `svc` command: sizes libuv's thread pool (before anything has used it), loads the
// TypeScript sources through tsx, then runs the CLI. CommonJS because an ES module entry is read
// through the pool, which fixes its size first.
require('./threadpool.cjs');

import('tsx/esm/api').then(({ register }) => {
  register();
  return import('../services/cli.ts');
});
