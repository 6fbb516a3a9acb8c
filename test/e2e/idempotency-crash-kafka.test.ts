/**
 * An Idempotency-Key retry after a crash (kill -9 between doing and recording the response)
 * stores the effect once, on Kafka: a trace batch, a spec version, an agent snapshot; and other
 * keys make other events. The drill is test/helpers/idempotency-crash.ts; keys, rules,
 * experiments and sandboxes are in idempotency-crash-resources-kafka.test.ts.
 */
import { randomBytes } from 'node:crypto';
import { backend } from '../helpers/backend.ts';
import { crashDrill } from '../helpers/idempotency-crash.ts';

const brokers = backend('SVC_TEST_KAFKA_BROKERS', 'idempotent retry after a crash, Kafka');
if (brokers)
  crashDrill(
    'idempotent retry after a crash, Kafka',
    { SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: brokers, SVC_LOG_NAMESPACE: `crash-${randomBytes(4).toString('hex')}.` },
    ['traces', 'specs', 'agents', 'other-keys'],
  );
