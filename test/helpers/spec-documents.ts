/** Spec documents shared by the spec's unit tests (test/unit/spec.test.ts) and its fuzzing (test/slow/). */

export type Doc = Record<string, unknown>;

/** A document using every block of the spec, with values that exercise their normalisation. */
export const everyBlock = (): Doc => ({
  version: 1,
  id: 'every-block',
  base: 'debian:bookworm',
  task: { prompt: 'Fix the {{ params.lang }} build' },
  agent: { type: 'cli', command: ['python', 'agent.py'], timeout: '90s', env: { LEVEL: 3, VERBOSE: true } },
  services: [
    {
      name: 'payments',
      type: 'http_mock',
      routes: [{ method: 'POST', path: '/charges', response: { status: 201, headers: { 'X-Mock': 'yes' }, body: { ok: true } } }],
      record: true,
    },
    { name: 'db', type: 'postgres', wait_for: { timeout: 45, query: 'select 1 from orders' } },
  ],
  fixtures: [
    { type: 'copy', from: '/opt/repo', to: 'repo' },
    { type: 'sql', service: 'db', sql: 'CREATE TABLE orders (id int)' },
    { type: 'git', url: 'git@github.com:example/app.git', to: 'app' },
    {
      type: 'drift',
      files: [{ path: 'repo/x.cfg', content: 'x=1', mode: '0600' }],
      delete: ['repo/tmp'],
      sql: [{ service: 'db', sql: 'DELETE FROM orders' }],
      routes: [{ service: 'payments', method: 'GET', path: '/charges/:id', response: { status: 404 } }],
      pick: 2,
    },
  ],
  setup: {
    files: [
      { path: '/workspace/a.sh', content: 'echo hi', mode: '0755' },
      { path: 'b.txt', content: '' },
    ],
    bundles: [{ digest: 'sha256:' + 'a'.repeat(64), to: 'vendor' }, { digest: 'sha256:' + 'b'.repeat(64) }],
    commands: ['make deps'],
    env: { PORT: 8080, DEBUG: false },
  },
  secrets: {
    API_TOKEN: 'dashboard',
    OTHER: 'env:HOST_TOKEN',
    OPENAI_KEY: { source: 'dashboard', inject: { hosts: ['API.openai.com', '*.example.com'], header: 'Authorization', format: 'Bearer {value}' } },
  },
  network: {
    egress: { default: 'deny', allow: ['pypi.org', '*.example.com'] },
    ingress: { default: 'allow', allow: [{ from: 'host', to_port: 3000 }] },
    dns_overrides: { 'api.stripe.com': 'payments' },
  },
  audit: { db_writes: true, http_calls: true, process_spawns: true, stdout_capture: true, file_system: { watch: ['/', 'src'], track: ['reads'] } },
  invariants: {
    exits: { check: { type: 'command_exit', command: 'make test', expect_exit: 2, timeout: '1m' }, weight: 3, gate: true },
    exists: { check: { type: 'file_exists', path: 'out/report.txt' }, weight: 0 },
    absent: { check: { type: 'file_absent', path: 'debug.log' } },
    contains: { check: { type: 'file_content', path: 'README.md', contains: 'Usage' } },
    matches: { check: { type: 'file_content', path: 'README.md', regex: '^# \\w+' } },
    rows: { check: { type: 'sql', service: 'db', query: 'SELECT count(*) FROM orders', expected: 0 } },
    mock: { check: { type: 'http_mock_assertions', service: 'payments', assertions: [{ method: 'POST', path: '/charges', condition: 'request_count>=2' }] } },
    inline: { check: { type: 'custom', script: 'import json\nprint(json.dumps({"passed": True}))\n' } },
    script: { check: { type: 'custom', script: '  checks/verify.py\n', timeout: 30 } },
    judge: { check: { type: 'llm_as_judge', rubric: 'Is it tidy?', threshold: 0.5, input: 'file:out/report.txt', model: 'judge-1' } },
  },
  forbidden: { db_writes_outside: ['orders', 'public.audit'], http_except: [], secrets_in_logs: 'deny', file_writes_outside: ['src', '/tmp'] },
  scoring: { pass_threshold: 0.75, replica_aggregation: { strategy: 'percentage', min_pass_rate: 0.5 } },
  parallelism: {
    replicas: 5,
    matrix: [
      { lang: 'python', strict: true },
      { lang: 'go', strict: false },
    ],
  },
  determinism: { frozen_time: '2026-03-01T12:00:00+01:00', seed: 7, dns: { 'db.internal': '10.1.2.3', 'v6.internal': '::1' } },
  resources: { timeout: '20m', concurrency_limit: 2, cpus: 0.5, memory: '256Mi', disk: '1G', pids: 64 },
  snapshots: { checkpoints: 'per_action' },
  teardown: {
    always_run: true,
    export: [
      { type: 'db_dump', service: 'db', to: 'runs/{{ run_id }}/db.sql' },
      { type: 'snapshot', to: 'state.json' },
    ],
  },
  alerts: [
    { name: 'pass rate', condition: 'pass_rate < 0.9', window: 'last_24h', notify: 'webhook', webhook_url: 'https://hooks.example.com/x' },
    { name: 'slow', condition: 'p95_wall_ms >= 60000', window: 'last_5_runs', notify: 'slack', slack_channel: '#evals' },
  ],
});
