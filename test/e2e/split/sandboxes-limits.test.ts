/**
 * The sandboxes suite's limits and error paths (../sandboxes-limits.test.ts) against the distributed
 * deployment: its processes on Kafka (test/helpers/server.ts, SVC_TEST_DEPLOYMENT=split).
 */
import { backend } from '../../helpers/backend.ts';

if (backend('SVC_TEST_KAFKA_BROKERS', 'the sandboxes limits and error paths on the distributed deployment')) {
  process.env.SVC_TEST_DEPLOYMENT = 'split';
  await import('../sandboxes-limits.test.ts');
}
