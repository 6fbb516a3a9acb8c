import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadConfig } from '../../services/kernel/config.ts';
import { checkSplitSettings, type ServiceName } from '../../services/main.ts';

const base = { SVC_API_KEY: 'a-long-enough-admin-key' };

test('defaults: embedded log, chDB, port 8080, auth on', () => {
  const c = loadConfig(base);
  assert.equal(c.port, 8080);
  assert.equal(c.logBackend, 'embedded');
  assert.equal(c.store, 'chdb');
  assert.equal(c.authRequired, true);
  assert.equal(c.logFsync, 'always');
  assert.equal(c.baseUrl, 'http://127.0.0.1:8080');
  assert.equal(c.sandboxTimeout, 600_000);
  assert.equal(c.rateLimitReads, 100);
  assert.equal(c.rateLimitWrites, 10);
});

test('every problem is reported at once, naming the variable', () => {
  assert.throws(
    () => loadConfig({ ...base, SVC_PORT: 'x', SVC_LOG_FSYNC: 'sometimes', SVC_IDEMPOTENCY_TTL: 'soon' }),
    (err: Error) => /SVC_PORT/.test(err.message) && /SVC_LOG_FSYNC/.test(err.message) && /SVC_IDEMPOTENCY_TTL/.test(err.message),
  );
});

test('backends need their addresses', () => {
  assert.throws(() => loadConfig({ ...base, SVC_LOG_BACKEND: 'kafka' }), /SVC_KAFKA_BROKERS: required/);
  assert.throws(() => loadConfig({ ...base, SVC_STORE: 'clickhouse' }), /SVC_CLICKHOUSE_URL: required/);
  assert.throws(() => loadConfig({ ...base, SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: 'nohost' }), /SVC_KAFKA_BROKERS: expected host:port/);
  const c = loadConfig({ ...base, SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: 'a:9092, b:9093' });
  assert.deepEqual(c.kafkaBrokers, ['a:9092', 'b:9093']);
});

test('an admin key is required unless auth is off, and must be long enough', () => {
  assert.throws(() => loadConfig({}), /SVC_API_KEY: an admin key is required/);
  assert.equal(loadConfig({ SVC_AUTH_REQUIRED: 'false' }).apiKey, null);
  assert.throws(() => loadConfig({ SVC_API_KEY: 'short' }), /at least 16 characters/);
  assert.equal(loadConfig({}, { SVC_API_KEY: 'from-the-flag-0123456' }).apiKey, 'from-the-flag-0123456');
});

test('fsync policy forms', () => {
  assert.equal(loadConfig({ ...base, SVC_LOG_FSYNC: 'never' }).logFsync, 'never');
  assert.deepEqual(loadConfig({ ...base, SVC_LOG_FSYNC: 'interval:200ms' }).logFsync, { intervalMs: 200 });
});

test('the maximum sandbox lifetime bounds the default timeouts and Node timers', () => {
  assert.equal(loadConfig(base).sandboxMaxLifetime, 24 * 3_600_000);
  assert.equal(loadConfig({ ...base, SVC_SANDBOX_MAX_LIFETIME: '2h', SVC_SANDBOX_TIMEOUT: '2h' }).sandboxMaxLifetime, 7_200_000);
  assert.throws(() => loadConfig({ ...base, SVC_SANDBOX_MAX_LIFETIME: '30d' }), /SVC_SANDBOX_MAX_LIFETIME: expected a duration from 1s to 24d/);
  assert.throws(() => loadConfig({ ...base, SVC_SANDBOX_MAX_LIFETIME: '0' }), /SVC_SANDBOX_MAX_LIFETIME/);
  assert.throws(() => loadConfig({ ...base, SVC_SANDBOX_MAX_LIFETIME: '5m' }), /SVC_SANDBOX_TIMEOUT: must be at most SVC_SANDBOX_MAX_LIFETIME/);
  assert.throws(
    () => loadConfig({ ...base, SVC_SANDBOX_MAX_LIFETIME: '1m', SVC_SANDBOX_TIMEOUT: '1m' }),
    /SVC_AGENT_TIMEOUT: must be at most SVC_SANDBOX_MAX_LIFETIME/,
  );
});

test('a process without the api needs no admin key; the service key is long and not the admin key', () => {
  assert.equal(loadConfig({}, {}, { requireAdminKey: false }).apiKey, null);
  assert.throws(() => loadConfig({ ...base, SVC_SERVICE_KEY: 'short' }), /SVC_SERVICE_KEY: the service key must have at least 16 characters/);
  assert.throws(() => loadConfig({ ...base, SVC_SERVICE_KEY: base.SVC_API_KEY }), /SVC_SERVICE_KEY: must differ from SVC_API_KEY/);
  assert.equal(loadConfig({ ...base, SVC_SERVICE_KEY: 'a-long-service-key-0123' }).serviceKey, 'a-long-service-key-0123');
});

test('svc run of some services says which settings the split needs, naming each', () => {
  const kafka = { SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: 'k:9092' };
  const secrets = { SVC_SECRETS_KEY: 'ab'.repeat(32) };
  const registry = { SVC_SCHEMA_REGISTRY_URL: 'http://api:8080/schema-registry' };
  const check = (env: Record<string, string>, names: ServiceName[]) => () =>
    checkSplitSettings(loadConfig(env, {}, { requireAdminKey: names.includes('api') }), names);
  assert.throws(check({ ...base }, ['api', 'sink']), /SVC_LOG_BACKEND: svc run <service...> splits the services over processes and needs kafka/);
  assert.throws(check({ ...base, ...kafka }, ['api', 'sink']), /SVC_SECRETS_KEY: required when the api and the sandbox runners run in different processes/);
  check({ ...base, ...kafka, ...secrets }, ['api', 'sink'])();
  assert.throws(check({ ...kafka }, ['aggregator']), /SVC_SCHEMA_REGISTRY_URL: required in a process without the api/);
  check({ ...kafka, ...registry }, ['aggregator'])();
  assert.throws(
    check({ ...kafka, ...registry }, ['sandbox-runner']),
    (err: Error) => /SVC_SECRETS_KEY/.test(err.message) && !/SVC_SCHEMA_REGISTRY_URL/.test(err.message),
  );
  check({ ...kafka, ...registry, ...secrets }, ['sandbox-runner'])();
});

test('svc run of the api or the scorer without the sink needs the shared ClickHouse server, naming SVC_STORE', () => {
  const kafka = { SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: 'k:9092' };
  const secrets = { SVC_SECRETS_KEY: 'ab'.repeat(32) };
  const registry = { SVC_SCHEMA_REGISTRY_URL: 'http://api:8080/schema-registry' };
  const server = { SVC_STORE: 'clickhouse', SVC_CLICKHOUSE_URL: 'http://default:@clickhouse:8123/default' };
  const check = (env: Record<string, string>, names: ServiceName[]) => () =>
    checkSplitSettings(loadConfig(env, {}, { requireAdminKey: names.includes('api') }), names);
  // The scorer alone on chDB would read its own empty store.
  assert.throws(check({ ...kafka, ...registry }, ['scorer']), (err: Error) => {
    assert.match(err.message, /^Bad configuration for svc run scorer:/);
    assert.match(err.message, /SVC_STORE: scorer reads the store the sink writes: set SVC_STORE=clickhouse \(and SVC_CLICKHOUSE_URL\)/);
    assert.doesNotMatch(err.message, /SVC_SCHEMA_REGISTRY_URL|SVC_SECRETS_KEY/);
    return true;
  });
  assert.throws(check({ ...base, ...kafka, ...secrets }, ['api']), /SVC_STORE: api reads the store the sink writes/);
  assert.throws(check({ ...base, ...kafka, ...secrets }, ['api', 'scorer']), /SVC_STORE: api and scorer read the store the sink writes/);
  assert.throws(check({ ...base, ...kafka, ...secrets, SVC_STORE: 'chdb' }, ['api', 'sandbox-runner']), /SVC_STORE/);
  // Beside the sink, chDB is the store it writes; with the server, every process reads the same one.
  check({ ...base, ...kafka, ...secrets }, ['api', 'sink'])();
  check({ ...base, ...kafka, ...secrets }, ['api', 'sink', 'scorer'])();
  check({ ...kafka, ...registry }, ['sink', 'scorer'])();
  check({ ...kafka, ...registry, ...server }, ['scorer'])();
  check({ ...base, ...kafka, ...secrets, ...server }, ['api'])();
  // The aggregator and the runners read no store.
  check({ ...kafka, ...registry }, ['aggregator'])();
  check({ ...kafka, ...registry, ...secrets }, ['sandbox-runner', 'aggregator'])();
});
