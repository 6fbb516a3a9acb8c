/**
 * The egress conformance suite (test/egress/conformance.ts) on the `local` runtime: bubblewrap
 * sandboxes, each on a network namespace of its own whose packets an nftables table hands to the
 * runner's egress gateway.
 */
import { backend } from '../helpers/backend.ts';
import { egressConformance } from './conformance.ts';

const bwrap = backend('SVC_TEST_BWRAP', 'egress conformance: the local runtime');

egressConformance({ name: 'local', unavailable: bwrap === null ? 'SVC_TEST_BWRAP is unset' : null, env: {} });
