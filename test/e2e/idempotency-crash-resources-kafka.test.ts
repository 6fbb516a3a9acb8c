/**
 * An Idempotency-Key retry after a crash (kill -9 between doing and recording the response)
 * makes no second one, on Kafka: an API key, a score rule, an experiment, a sandbox. The drill
 * is test/helpers/idempotency-crash.ts; trace batches, specs and agents are in
 * idempotency-crash-kafka.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { backend } from '../helpers/backend.ts';
import { crashDrill } from '../helpers/idempotency-crash.ts';

const brokers = backend('SVC_TEST_KAFKA_BROKERS', 'idempotent retry after a crash, Kafka');
if (brokers)
  crashDrill(
    'idempotent retry after a crash, Kafka',
    { SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: brokers, SVC_LOG_NAMESPACE: `crash-${randomBytes(4).toString('hex')}.` },
    ['keys-and-rules', 'experiments', 'sandboxes'],
  );
