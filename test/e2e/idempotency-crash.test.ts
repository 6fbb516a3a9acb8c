/**
 * An Idempotency-Key retry after a crash (kill -9 between doing and recording the response)
 * stores the effect once, on the embedded log: a trace batch, a spec version, an agent snapshot;
 * and other keys make other events. The drill is test/helpers/idempotency-crash.ts; keys, rules,
 * experiments and sandboxes are in idempotency-crash-resources.test.ts.
 */
import { crashDrill } from '../helpers/idempotency-crash.ts';

crashDrill('idempotent retry after a crash, embedded log', {}, ['traces', 'specs', 'agents', 'other-keys']);
