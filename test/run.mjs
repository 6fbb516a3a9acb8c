#!/usr/bin/env node
// `npm test [-- FILES/FLAGS]`: provisions the real backends the tests use, runs node's test
// runner over test/**/*.test.ts, stops what it started and exits with the runner's code.
//
//   npm test                                 every test file
//   npm test -- test/unit/foo.test.ts        only these files (backends only if they need them)
//   npm test -- --test-name-pattern=murmur   extra flags go to `node --test`
//
// Backends (each is skipped, with a one-line reason, when this machine cannot run it; under
// CI=true a missing backend is an error instead). A backend whose variable is already set in
// the environment is used as it is, not started.
//   Kafka        SVC_TEST_KAFKA_BROKERS     infra/kafka (Maven Central; needs java and mvn)
//   ClickHouse   SVC_TEST_CLICKHOUSE_URL    Debian's clickhouse-server, infra/clickhouse config
//
// Test files run in parallel, one process each (SVC_TEST_CONCURRENCY, default: the CPU count,
// at most 4): they share the backends but use unique topic, group, table and port names. On
// 2 cores the whole suite takes about 26 s instead of 39 s one file at a time.
// CI=true: a backend that cannot run is an error, not a skip.

import { execFileSync, spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const CI = process.env.CI === 'true';
const say = (line) => console.log(`npm test: ${line}`);

// ---------------------------------------------------------------------------------------------
// Arguments: files (or directories) to run, and flags for `node --test`.

const args = process.argv.slice(2);
const flags = args.filter((a) => a.startsWith('-'));
const selected = args.filter((a) => !a.startsWith('-'));
const files = selected.length
  ? selected.flatMap((a) => (fs.statSync(a, { throwIfNoEntry: false })?.isDirectory() ? testFiles(a) : [a]))
  : testFiles(path.join(root, 'test'));

function testFiles(dir) {
  return fs
    .readdirSync(dir, { recursive: true })
    .filter((f) => /\.test\.(ts|mts|js|mjs)$/.test(f))
    .map((f) => path.join(dir, f))
    .filter((f) => !f.split(path.sep).includes('node_modules'))
    .sort();
}

/** Whether the selected files (or local modules they import) read `envVar`. */
function needed(envVar) {
  if (!selected.length) return true;
  const seen = new Set();
  const visit = (file) => {
    const abs = path.resolve(file);
    if (seen.has(abs)) return false;
    seen.add(abs);
    let text;
    try {
      text = fs.readFileSync(abs, 'utf8');
    } catch {
      return false;
    }
    if (text.includes(envVar)) return true;
    for (const [, spec] of text.matchAll(/(?:from|import)\s*\(?\s*['"](\.{1,2}\/[^'"]+)['"]/g)) {
      if (visit(path.resolve(path.dirname(abs), spec))) return true;
    }
    return false;
  };
  return files.some(visit);
}

// ---------------------------------------------------------------------------------------------
// Backends.

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-test-'));
const stops = [];
const missing = []; // backends this machine cannot run: fatal under CI=true

function onPath(cmd) {
  return (process.env.PATH ?? '')
    .split(path.delimiter)
    .concat(['/usr/sbin', '/sbin'])
    .map((dir) => path.join(dir, cmd))
    .find((p) => {
      try {
        fs.accessSync(p, fs.constants.X_OK);
        return true;
      } catch {
        return false;
      }
    });
}

const backends = [
  {
    name: 'Kafka',
    env: 'SVC_TEST_KAFKA_BROKERS',
    async start() {
      const { startKafka, missingTools, classpathCached } = await import('../infra/kafka/kafka.mjs');
      const lacking = missingTools();
      if (lacking.length) return { skip: `${lacking.join(' and ')} not on PATH (apt-get install default-jdk-headless maven)` };
      if (!classpathCached()) {
        say('Kafka: first run, resolving the broker from Maven Central (cached in ~/.m2 afterwards)…');
      }
      const kafka = await startKafka({ workDir: path.join(tmp, 'kafka') });
      // Where the broker keeps its segments: the split deployment's suites look there for secrets.
      process.env.SVC_TEST_KAFKA_DATA_DIR = path.join(kafka.workDir, 'data');
      return { value: kafka.brokers, stop: kafka.stop };
    },
  },
  {
    name: 'ClickHouse server',
    env: 'SVC_TEST_CLICKHOUSE_URL',
    start: startClickHouse,
  },
  {
    name: 'bubblewrap (local sandbox runtime)',
    env: 'SVC_TEST_BWRAP',
    start: startBubblewrap,
  },
];

/** The Debian packages the `local` sandbox runtime uses (infra/sandbox-packages.txt is the list). */
const SANDBOX_PACKAGES = fs
  .readFileSync(path.join(root, 'infra/sandbox-packages.txt'), 'utf8')
  .split('\n')
  .map((l) => l.replace(/#.*/, '').trim())
  .filter(Boolean);

function aptInstall(packages) {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  execFileSync('apt-get', ['update', '-qq'], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  execFileSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', ...packages], { env, stdio: ['ignore', 'ignore', 'pipe'] });
}

async function startBubblewrap() {
  const absent = SANDBOX_PACKAGES.filter((pkg) => {
    try {
      execFileSync('dpkg-query', ['-W', '-f=${Status}', pkg], { stdio: ['ignore', 'pipe', 'ignore'] });
      return false;
    } catch {
      return true;
    }
  });
  if (absent.length && process.getuid?.() === 0 && onPath('apt-get')) {
    say(`installing ${absent.join(' ')} with apt-get (Debian packages)…`);
    try {
      aptInstall(absent);
    } catch (err) {
      return { skip: `apt-get install ${absent.join(' ')} failed: ${String(err.stderr ?? err.message).trim().split('\n').at(-1)}` };
    }
  }
  const bwrap = onPath('bwrap');
  if (!bwrap) return { skip: 'bwrap is not installed (apt-get install bubblewrap)' };
  try {
    execFileSync(bwrap, ['--unshare-all', '--die-with-parent', '--ro-bind', '/', '/', 'true'], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 10_000 });
  } catch (err) {
    return { skip: `bwrap cannot create namespaces here: ${String(err.stderr ?? err.message).trim()}` };
  }
  return { value: bwrap, stop: async () => {} };
}

async function provision(backend) {
  if (process.env[backend.env]) return `${backend.name} ${process.env[backend.env]} (given)`;
  if (!needed(backend.env)) return null;
  const started = Date.now();
  let result;
  try {
    result = await backend.start();
  } catch (err) {
    result = { skip: `it failed to start: ${err.message}` };
  }
  if (result.skip) {
    missing.push(`${backend.name}: ${result.skip}`);
    if (!CI) say(`${backend.name} tests will be skipped: ${result.skip}`);
    return null;
  }
  stops.push({ name: backend.name, stop: result.stop });
  process.env[backend.env] = result.value;
  return `${backend.name} ${result.value} (${((Date.now() - started) / 1000).toFixed(1)} s)`;
}

// ClickHouse: Debian's clickhouse-server as a child process, on free ports, in a temp dir.
async function startClickHouse() {
  let server = onPath('clickhouse-server');
  if (!server && process.getuid?.() === 0 && onPath('apt-get')) {
    say('installing clickhouse-server with apt-get (Debian package)…');
    const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
    try {
      execFileSync('apt-get', ['update', '-qq'], { env, stdio: ['ignore', 'ignore', 'pipe'] });
      execFileSync('apt-get', ['install', '-y', '-qq', '--no-install-recommends', 'clickhouse-server'], { env, stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (err) {
      return { skip: `apt-get install clickhouse-server failed: ${String(err.stderr ?? err.message).trim().split('\n').at(-1)}` };
    }
    server = onPath('clickhouse-server');
  }
  if (!server) return { skip: 'clickhouse-server is not installed (apt-get install clickhouse-server; needs root)' };

  const dir = path.join(tmp, 'clickhouse');
  for (const sub of ['tmp', 'user_files', 'format_schemas']) fs.mkdirSync(path.join(dir, sub), { recursive: true });
  const [httpPort, tcpPort] = await freePorts(2);
  const child = spawn(
    server,
    [
      `--config-file=${path.join(root, 'infra/clickhouse/config.xml')}`,
      '--',
      `--path=${dir}/`,
      `--tmp_path=${dir}/tmp/`,
      `--user_files_path=${dir}/user_files/`,
      `--format_schema_path=${dir}/format_schemas/`,
      `--http_port=${httpPort}`,
      `--tcp_port=${tcpPort}`,
      `--logger.log=${dir}/server.log`,
      `--logger.errorlog=${dir}/error.log`,
    ],
    { cwd: dir, stdio: ['ignore', 'ignore', fs.openSync(path.join(dir, 'stderr.log'), 'a')] },
  );
  const stop = stopper(child, 10_000);
  const deadline = Date.now() + 30_000;
  while ((await ping(`http://127.0.0.1:${httpPort}/ping`)) !== 'Ok.') {
    if (child.exitCode !== null || Date.now() > deadline) {
      await stop();
      const log = [path.join(dir, 'error.log'), path.join(dir, 'stderr.log')].map((f) => (fs.existsSync(f) ? fs.readFileSync(f, 'utf8') : '')).join('').trim();
      throw new Error(`clickhouse-server did not answer /ping${log ? `: ${log.split('\n').slice(-3).join(' | ')}` : ''}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return { value: `http://default:@127.0.0.1:${httpPort}/default`, stop };
}

function ping(url) {
  return new Promise((resolve) => {
    const req = http.get(url, { timeout: 1000 }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve(body.trim()));
    });
    req.on('error', () => resolve(null));
    req.on('timeout', () => req.destroy());
  });
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves when the process is gone. */
function stopper(child, graceMs) {
  const gone = new Promise((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve() : child.once('exit', resolve)));
  const killOnExit = () => child.kill('SIGKILL');
  process.once('exit', killOnExit);
  return async () => {
    process.removeListener('exit', killOnExit);
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGTERM');
      const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
      await gone;
      clearTimeout(timer);
    }
  };
}

async function freePorts(count) {
  const servers = await Promise.all(
    Array.from({ length: count }, () => new Promise((resolve, reject) => {
      const s = net.createServer();
      s.once('error', reject);
      s.listen(0, '127.0.0.1', () => resolve(s));
    })),
  );
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))));
  return ports;
}

async function stopAll() {
  const all = stops.splice(0).reverse();
  const results = await Promise.allSettled(all.map((s) => s.stop()));
  results.forEach((r, i) => {
    if (r.status === 'rejected') console.error(`npm test: stopping ${all[i].name} failed: ${r.reason?.message ?? r.reason}`);
  });
  fs.rmSync(tmp, { recursive: true, force: true });
}

// ---------------------------------------------------------------------------------------------
// Run.

let runner = null;
let interrupted = false;
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, async () => {
    if (interrupted) return;
    interrupted = true;
    runner?.kill(signal);
    if (!runner) {
      await stopAll();
      process.exit(130);
    }
  });
}

const ready = (await Promise.all(backends.map(provision))).filter(Boolean);
if (missing.length && CI) {
  for (const m of missing) console.error(`npm test: CI=true needs every backend, but ${m}`);
  await stopAll();
  process.exit(1);
}
if (ready.length) say(`backends: ${ready.join(', ')}`);
if (interrupted) {
  await stopAll();
  process.exit(130);
}

const hasFlag = (name) => flags.some((f) => f === name || f.startsWith(`${name}=`));
const nodeArgs = [
  // libuv's pool sized as the service's entry points size it (bin/threadpool.cjs); the test
  // files' own children (services, the CLI) inherit it.
  '--require',
  path.join(root, 'bin', 'threadpool.cjs'),
  '--import',
  'tsx',
  '--test',
  ...(hasFlag('--test-concurrency') ? [] : [`--test-concurrency=${process.env.SVC_TEST_CONCURRENCY ?? Math.min(4, Math.max(1, os.availableParallelism()))}`]),
  // A file that hangs (an open handle, a stuck wait) fails after this instead of hanging CI.
  ...(hasFlag('--test-timeout') ? [] : ['--test-timeout=600000']),
  ...(hasFlag('--test-reporter') ? [] : ['--test-reporter=spec']),
  ...flags,
  ...files,
];
runner = spawn(process.execPath, nodeArgs, { cwd: root, stdio: 'inherit', env: process.env });
const code = await new Promise((resolve) => runner.once('exit', (c, signal) => resolve(c ?? (signal ? 128 + (os.constants.signals[signal] ?? 1) : 1))));
await stopAll();
process.exit(code);
