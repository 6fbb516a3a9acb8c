/**
 * An Idempotency-Key retry after a crash (kill -9 between doing and recording the response)
 * makes no second one, on the embedded log: an API key, a score rule, an experiment, a sandbox.
 * The drill is test/helpers/idempotency-crash.ts; trace batches, specs and agents are in
 * idempotency-crash.test.ts.
 */
import { crashDrill } from '../helpers/idempotency-crash.ts';

crashDrill('idempotent retry after a crash, embedded log', {}, ['keys-and-rules', 'experiments', 'sandboxes']);
