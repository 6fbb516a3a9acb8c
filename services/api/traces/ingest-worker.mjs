// The entry of the ingest worker threads (piscina): loads ingest-worker.ts through tsx. Worker
// threads do not get tsx from an in-process registration (`svc start`, bin/svc.cjs), and under
// `node --import tsx` a plain-JS entry does not resolve .ts imports either (measured on Node
// 20.20), so the entry registers tsx itself in either case.
import { register } from 'tsx/esm/api';

register();
const worker = await import('./ingest-worker.ts');
export default worker.default;
