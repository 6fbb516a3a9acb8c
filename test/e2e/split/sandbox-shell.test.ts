/**
 * The sandbox shell's suite (../sandbox-shell.test.ts) against the distributed deployment: its
 * processes on Kafka (test/helpers/server.ts, SVC_TEST_DEPLOYMENT=split), so a terminal's bytes
 * cross from the api's process to the runner's over the log, and the api's death is a test.
 */
import { backend } from '../../helpers/backend.ts';

if (backend('SVC_TEST_KAFKA_BROKERS', 'the sandbox shell suite on the distributed deployment')) {
  process.env.SVC_TEST_DEPLOYMENT = 'split';
  await import('../sandbox-shell.test.ts');
}
