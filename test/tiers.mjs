// The test suite's tiers: each folder under test/ that holds *.test.ts files belongs to exactly
// one (test/unit/test-tiers.test.ts holds this), so the tiers together are `npm test`.
//
//   unit      no root, no backend, no service process: pure code and in-process parts; under a
//             minute on 2 cores. A case that needs root or a backend goes to another tier; a fuzz
//             or race case over a few seconds goes to `slow`.
//   slow      unit-like cases that take long: fuzzing, exchange races. No backend.
//   contract  a seam or a part against the real thing: the event-log and store suites on Kafka,
//             ClickHouse and chDB, image pulls and builds, the sandbox runtime's isolation and its
//             contract suite, egress conformance. Needs root and the Debian packages npm test
//             installs; starts no service process.
//   e2e       the service as a process (embedded and split deployments, docker compose) driven over
//             HTTP, the CLI and the dashboard; and the red-team suites, which attack that process.
export const TIERS = {
  unit: ['unit'],
  slow: ['slow'],
  contract: ['contract', 'integration', 'isolation', 'egress', 'runtime'],
  e2e: ['e2e', 'red-team'],
};

// Tiers that start no backend: a test in them that asks for one is skipped (fails under CI=true),
// which says it is in the wrong tier.
export const WITHOUT_BACKENDS = ['unit', 'slow'];
