/**
 * Debian's Chromium (infra/sandbox-packages.txt) for the dashboard's tests and bench, driven by
 * playwright-core: headless, and quiet (no update checks, sync, metrics, safe-browsing or
 * translate calls home), so a page load is the page's own requests and nothing else.
 */
import { existsSync } from 'node:fs';

export const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p));

export const CHROMIUM_ARGS = [
  '--no-sandbox', // the tests run as root, where Chromium's own sandbox cannot start
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--disable-default-apps',
  '--disable-extensions',
  '--disable-domain-reliability',
  '--disable-breakpad',
  '--disable-client-side-phishing-detection',
  '--no-first-run',
  '--no-pings',
  '--metrics-recording-only',
  '--disable-features=Translate,OptimizationHints,MediaRouter,AutofillServerCommunication,CertificateTransparencyComponentUpdater',
];
