/**
 * The sandboxes suite's cases with a service of their own (../sandboxes-own-server.test.ts) against the distributed
 * deployment: its processes on Kafka (test/helpers/server.ts, SVC_TEST_DEPLOYMENT=split).
 */
import { backend } from '../../helpers/backend.ts';

if (backend('SVC_TEST_KAFKA_BROKERS', 'the sandboxes cases with a service of their own on the distributed deployment')) {
  process.env.SVC_TEST_DEPLOYMENT = 'split';
  await import('../sandboxes-own-server.test.ts');
}
