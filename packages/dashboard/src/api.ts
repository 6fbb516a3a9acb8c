/**
 * The dashboard's way to the service: the SDK client (packages/sdk) on this page's origin, with
 * the tenant key the user entered once. The key lives in sessionStorage (gone when the tab
 * closes), is sent only as `Authorization: Bearer`, and never in a cookie or a URL.
 */
import { createClient, SvcError, type SvcClient } from '../../sdk/src/client.ts';

const STORAGE_KEY = 'svc.apiKey';

export const storedKey = (): string | null => sessionStorage.getItem(STORAGE_KEY);
export const storeKey = (key: string) => sessionStorage.setItem(STORAGE_KEY, key);
export const forgetKey = () => sessionStorage.removeItem(STORAGE_KEY);

export function clientFor(apiKey: string): SvcClient {
  return createClient({ baseUrl: window.location.origin, apiKey, sandboxId: '' });
}

/** The client of the stored key; a 401 anywhere sends the user back to the key form. */
export function api(): SvcClient {
  return clientFor(storedKey() ?? '');
}

export const isUnauthorized = (err: unknown) => err instanceof SvcError && err.status === 401;

/** Tells the app the key stopped working (revoked, rotated): it asks for one again. */
export function reportUnauthorized(): void {
  forgetKey();
  window.dispatchEvent(new CustomEvent('svc:unauthorized'));
}

export function errorText(err: unknown): string {
  if (err instanceof SvcError) return `${err.status} ${err.error}: ${err.message}`;
  return (err as Error)?.message ?? String(err);
}

export { SvcError };
