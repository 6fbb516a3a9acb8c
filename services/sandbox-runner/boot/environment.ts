/**
 * The environment every command of a sandbox gets, made as its runtime starts
 * (boot/runtime.ts): the image's, the secrets, the network's and backing services' variables,
 * the spec's, the service's own, the request's, and determinism's.
 */
import { frozenClockEnv } from '../frozen-clock.ts';
import { SERVICE_URL_IN_SANDBOX } from '../runtimes/local/service-bridge.ts';
import { IMAGE_PATH } from '../parts/sandbox-env.ts';
import type { BootContext } from './context.ts';

/** HOME of a sandbox with `private_home`: a directory of the sandbox user in its private /tmp. */
export const AGENT_HOME = '/tmp/home';

export function baseEnv(ctx: BootContext): Record<string, string> {
  const { determinism } = ctx.spec;
  const { config } = ctx.kernel;
  const env: Record<string, string> = {
    HOME: ctx.request.private_home ? AGENT_HOME : '/workspace',
    PATH: IMAGE_PATH,
    LANG: 'C.UTF-8',
    ...ctx.env.imageEnv,
    ...ctx.env.secretValues,
    // The trust store's paths; a brokered secret's placeholder over its value.
    ...ctx.network.env(),
    // Where its backing services are, and the databases' credentials.
    ...ctx.backing.env(),
    ...ctx.spec.setup.env,
    // Inside, the service is reached through the sandbox's bridge (runtimes/local/service-bridge.ts).
    SVC_BASE_URL: serviceAddress(config.baseUrl)?.urlInside ?? config.baseUrl,
    SVC_API_KEY: ctx.token,
    SVC_SANDBOX_ID: ctx.sandboxId,
    ...ctx.request.extra_env,
  };
  if (determinism.frozenTime) {
    Object.assign(env, frozenClockEnv(determinism.frozenTime));
  }
  if (determinism.seed !== null) {
    env.SVC_RANDOM_SEED = String(determinism.seed);
    env.PYTHONHASHSEED = String(determinism.seed);
  }
  return env;
}

/**
 * The host and port a sandbox's bridge forwards to, and the base URL it gives the sandbox (the
 * base URL's path kept): only for a plain-HTTP base URL (TLS names would not match 127.0.0.1).
 */
export function serviceAddress(baseUrl: string): { address: { host: string; port: number }; urlInside: string } | null {
  const url = new URL(baseUrl);
  if (url.protocol !== 'http:') return null;
  return {
    address: { host: url.hostname.replace(/^\[|\]$/g, ''), port: Number(url.port || 80) },
    urlInside: `${SERVICE_URL_IN_SANDBOX}${url.pathname.replace(/\/+$/, '')}`,
  };
}

/** An image config's `Env` (`NAME=value` strings) as variables; malformed entries and HOME (the sandbox's own) are left out. */
export function imageEnv(entries: string[]): Record<string, string> {
  return Object.fromEntries(
    entries.flatMap((entry) => {
      const at = entry.indexOf('=');
      return at > 0 && entry.slice(0, at) !== 'HOME' ? [[entry.slice(0, at), entry.slice(at + 1)]] : [];
    }),
  );
}
