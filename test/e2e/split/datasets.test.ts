/**
 * The datasets suite (../datasets.test.ts) against the distributed deployment: its processes on
 * Kafka (test/helpers/server.ts, SVC_TEST_DEPLOYMENT=split), so an experiment over a dataset is
 * planned by an aggregator of its own, from the scenarios it reads on the log.
 */
import { backend } from '../../helpers/backend.ts';

if (backend('SVC_TEST_KAFKA_BROKERS', 'the datasets suite on the distributed deployment')) {
  process.env.SVC_TEST_DEPLOYMENT = 'split';
  await import('../datasets.test.ts');
}
