// A real Apache Kafka broker (KRaft, one node that is both broker and controller) for tests
// and local runs, fetched from Maven Central: infra/kafka/pom.xml names the version, Maven
// resolves its classpath (jars are cached in ~/.m2, the classpath in the state dir below), and
// this module formats the storage, writes server.properties with free ports and runs
// `java kafka.Kafka`. Plain JS on purpose: test/run.mjs imports it without a TS loader.
//
//   import { startKafka } from './infra/kafka/kafka.mjs';
//   const kafka = await startKafka({ workDir });  // kafka.brokers === '127.0.0.1:PORT'
//   await kafka.stop();
//
// By hand: `node infra/kafka/kafka.mjs [--port 9092]` starts a fresh broker in
// <state dir>/broker, prints the brokers string and runs until Ctrl-C.
//
// Nothing is written into the checkout: the state dir is $XDG_STATE_HOME/svc/kafka
// (~/.local/state/svc/kafka when XDG_STATE_HOME is unset), so a read-only checkout works and
// `git status` stays clean.

import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import kafkajs from 'kafkajs';

const { Kafka, logLevel } = kafkajs;

const here = path.dirname(fileURLToPath(import.meta.url));
const pomFile = path.join(here, 'pom.xml');
const log4jConfig = path.join(here, 'log4j2.xml');

/** Where this module writes: outside the checkout (see the top of the file). */
export const STATE_DIR = path.join(process.env.XDG_STATE_HOME || path.join(os.homedir(), '.local', 'state'), 'svc', 'kafka');

/** The cached classpath of this pom.xml: named by its content, so another version (or checkout) has its own. */
function classpathFile() {
  const pomHash = createHash('sha256').update(fs.readFileSync(pomFile)).digest('hex').slice(0, 16);
  return path.join(STATE_DIR, `classpath-${pomHash}.txt`);
}

/** True when the classpath is cached and every jar of it is in ~/.m2 (no Maven run needed). */
export function classpathCached() {
  try {
    const cached = fs.readFileSync(classpathFile(), 'utf8').trim();
    return cached !== '' && cached.split(path.delimiter).every((jar) => fs.existsSync(jar));
  } catch {
    return false;
  }
}

const START_TIMEOUT_MS = 120_000;
const STOP_TIMEOUT_MS = 15_000;

/** Fails with a message that says what to install when java or mvn is missing. */
export function missingTools() {
  const missing = [];
  for (const tool of ['java', 'mvn']) if (!onPath(tool)) missing.push(tool);
  return missing;
}

function onPath(cmd) {
  for (const dir of (process.env.PATH ?? '').split(path.delimiter)) {
    if (!dir) continue;
    try {
      fs.accessSync(path.join(dir, cmd), fs.constants.X_OK);
      return true;
    } catch {
      /* not here */
    }
  }
  return false;
}

/**
 * The broker's classpath. Resolved with Maven once per pom.xml content and cached in the state
 * dir; resolved again when a jar of it has gone from ~/.m2.
 */
export async function kafkaClasspath() {
  const file = classpathFile();
  if (classpathCached()) return fs.readFileSync(file, 'utf8').trim();
  // Write to a private file, then rename: two runs resolving at once never read half a file.
  const tmp = `${file}.${process.pid}.tmp`;
  fs.mkdirSync(STATE_DIR, { recursive: true });
  await run('mvn', ['-q', '-B', '-f', pomFile, 'dependency:build-classpath', `-Dmdep.outputFile=${tmp}`], {
    what: 'mvn dependency:build-classpath (infra/kafka/pom.xml)',
  });
  fs.renameSync(tmp, file);
  return fs.readFileSync(file, 'utf8').trim();
}

/**
 * Starts a single-node Kafka broker in `workDir` (created if missing; its Kafka files are
 * replaced). Resolves once the broker answers metadata requests.
 * @param {{ workDir: string, port?: number }} options
 * @returns {Promise<{ brokers: string, workDir: string, stop(): Promise<void> }>}
 */
export async function startKafka({ workDir, port }) {
  const missing = missingTools();
  if (missing.length) throw new Error(`Kafka needs ${missing.join(' and ')} on PATH (Debian: apt-get install default-jdk-headless maven)`);
  const classpath = await kafkaClasspath();

  workDir = path.resolve(workDir);
  const dataDir = path.join(workDir, 'data');
  const logsDir = path.join(workDir, 'logs');
  fs.rmSync(dataDir, { recursive: true, force: true });
  fs.mkdirSync(dataDir, { recursive: true });
  fs.mkdirSync(logsDir, { recursive: true });

  const [brokerPort, controllerPort] = await freePorts(2, port);
  const propsFile = path.join(workDir, 'server.properties');
  fs.writeFileSync(propsFile, serverProperties({ dataDir, brokerPort, controllerPort }));

  const jvm = [
    '-Xms128m',
    '-Xmx512m',
    '-XX:+UseG1GC',
    '-XX:MaxGCPauseMillis=20',
    '-Djava.awt.headless=true',
    `-Dlog4j2.configurationFile=${log4jConfig}`,
    `-Dkafka.logs.dir=${logsDir}`,
    '-cp',
    classpath,
  ];

  // A random cluster id in Kafka's form: 16 bytes, URL-safe base64 without padding. Like
  // Kafka's Uuid.randomUuid, never one that starts with "-": the tool would read it as an option.
  let clusterId;
  do clusterId = randomBytes(16).toString('base64url');
  while (clusterId.startsWith('-'));
  // The format tool is short-lived: the C1 compiler alone starts it faster.
  await run('java', ['-XX:TieredStopAtLevel=1', ...jvm, 'kafka.tools.StorageTool', 'format', '-t', clusterId, '-c', propsFile], {
    what: 'kafka-storage format',
    cwd: workDir,
  });

  const outFile = path.join(logsDir, 'stdout.log');
  const out = fs.openSync(outFile, 'a');
  const child = spawn('java', [...jvm, 'kafka.Kafka', propsFile], { cwd: workDir, stdio: ['ignore', out, out] });
  fs.closeSync(out);

  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      exited = { code, signal };
      resolve(exited);
    });
  });
  // Never leave a broker behind when this process goes away without calling stop().
  const killOnExit = () => {
    if (!exited) child.kill('SIGKILL');
  };
  process.once('exit', killOnExit);

  const brokers = `127.0.0.1:${brokerPort}`;
  const stop = async () => {
    process.removeListener('exit', killOnExit);
    if (exited) return;
    child.kill('SIGTERM');
    const timer = setTimeout(() => child.kill('SIGKILL'), STOP_TIMEOUT_MS);
    await exitPromise;
    clearTimeout(timer);
  };

  try {
    await waitUntilReady(brokers, () => exited, START_TIMEOUT_MS);
  } catch (err) {
    await stop();
    throw new Error(`${err.message}\n--- tail of ${path.join(logsDir, 'server.log')} ---\n${tail(path.join(logsDir, 'server.log'))}${tail(outFile)}`);
  }
  return { brokers, workDir, stop };
}

/**
 * The single node's settings (KRaft, broker and controller): the tests' broker, and the compose
 * image's (infra/compose/build-images.sh writes them into it, listening on every address and
 * advertising `advertised`).
 */
export function serverProperties({ dataDir, brokerPort, controllerPort, listenHost = '127.0.0.1', advertised = `PLAINTEXT://127.0.0.1:${brokerPort}` }) {
  return `# Written by infra/kafka/kafka.mjs: one node, broker and controller (KRaft).
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:${controllerPort}
listeners=PLAINTEXT://${listenHost}:${brokerPort},CONTROLLER://127.0.0.1:${controllerPort}
advertised.listeners=${advertised}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=${dataDir}
# Topics come from the catalog (created by the log backend); a typo must not create one.
auto.create.topics.enable=false
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
# One node: internal topics with one replica, and few partitions so they are created fast.
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
# A group starts its first rebalance at once (default 3 s), which tests feel.
group.initial.rebalance.delay.ms=0
# Room for 16 MiB records (topics set max.message.bytes themselves).
message.max.bytes=16777216
replica.fetch.max.bytes=16777216
# A modest heap: the log cleaner's dedupe buffer would take 128 MiB by default.
log.cleaner.dedupe.buffer.size=16777216
num.network.threads=2
num.io.threads=4
`;
}

async function waitUntilReady(brokers, exited, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  const [host, port] = brokers.split(':');
  // First the listener: connection refused is cheap to poll.
  while (!(await canConnect(host, Number(port)))) {
    if (exited()) throw new Error(`Kafka exited during start (${JSON.stringify(exited())})`);
    if (Date.now() > deadline) throw new Error(`Kafka did not open ${brokers} within ${timeoutMs} ms`);
    await sleep(100);
  }
  // Then the broker must answer metadata with itself in it (it is registered and unfenced).
  const kafka = new Kafka({ clientId: 'svc-kafka-probe', brokers: [brokers], logLevel: logLevel.NOTHING, retry: { retries: 0 } });
  let lastError;
  while (Date.now() < deadline) {
    if (exited()) throw new Error(`Kafka exited during start (${JSON.stringify(exited())})`);
    const admin = kafka.admin();
    try {
      await admin.connect();
      const cluster = await admin.describeCluster();
      if (cluster.brokers.length > 0 && cluster.controller != null && cluster.controller >= 0) {
        // Find a group coordinator once: that creates __consumer_offsets now, not in the first
        // test that joins a group (kafkajs would retry "coordinator not available" meanwhile).
        await admin.describeGroups(['svc-kafka-probe']);
        // Likewise the first producer id (an idempotent producer asks for one on connect).
        const producer = kafka.producer({ idempotent: true, retry: { retries: 1, initialRetryTime: 100 } });
        try {
          await producer.connect();
        } finally {
          await producer.disconnect().catch(() => {});
        }
        return;
      }
      lastError = new Error(`metadata without brokers or controller: ${JSON.stringify(cluster)}`);
    } catch (err) {
      lastError = err;
    } finally {
      await admin.disconnect().catch(() => {});
    }
    await sleep(100);
  }
  throw new Error(`Kafka at ${brokers} did not answer metadata within ${timeoutMs} ms: ${lastError?.message}`);
}

function canConnect(host, port) {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port });
    socket.once('connect', () => {
      socket.destroy();
      resolve(true);
    });
    socket.once('error', () => resolve(false));
  });
}

/** `count` ports that are free now (all bound at once so they differ); `first` if given. */
async function freePorts(count, first) {
  const servers = [];
  try {
    for (let i = 0; i < count; i++) {
      const server = net.createServer();
      await new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(i === 0 && first ? first : 0, '127.0.0.1', resolve);
      });
      servers.push(server);
    }
    return servers.map((s) => s.address().port);
  } finally {
    await Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve))));
  }
}

function run(cmd, args, { what, cwd } = {}) {
  return new Promise((resolve, reject) => {
    // Maven runs in the state dir, not the caller's directory (a checkout): nothing lands there.
    const child = spawn(cmd, args, { cwd: cwd ?? STATE_DIR, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    const keep = (chunk) => {
      output = (output + chunk).slice(-8000);
    };
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);
    child.once('error', (err) => reject(new Error(`${what}: ${err.message}`)));
    child.once('exit', (code, signal) => {
      if (code === 0) resolve(output);
      else reject(new Error(`${what} failed (${signal ?? `exit ${code}`}):\n${output}`));
    });
  });
}

function tail(file, bytes = 4000) {
  try {
    const text = fs.readFileSync(file, 'utf8');
    return text.length > bytes ? text.slice(-bytes) : text;
  } catch {
    return '';
  }
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// `node infra/kafka/kafka.mjs [--port N]`: a broker by hand, until Ctrl-C.
if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const portArg = process.argv.indexOf('--port');
  const port = portArg > 0 ? Number(process.argv[portArg + 1]) : undefined;
  const workDir = path.join(STATE_DIR, 'broker');
  const started = Date.now();
  const kafka = await startKafka({ workDir, port });
  console.log(`Kafka is up in ${Date.now() - started} ms (logs in ${path.join(workDir, 'logs')})`);
  console.log(`SVC_KAFKA_BROKERS=${kafka.brokers}`);
  let stopping = false;
  const shutdown = async () => {
    if (stopping) return;
    stopping = true;
    console.log('stopping Kafka…');
    await kafka.stop();
    process.exit(0);
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
}
