/**
 * A stored spec looked up for another resource (an experiment, a score rule, an eval's history),
 * where a missing spec is that resource's error rather than the catalog's plain 404.
 */
import { AppError } from '../kernel/errors.ts';
import type { SpecCatalog } from './catalogs/spec-catalog.ts';

/** `specs.get(...)`, with its not_found error replaced by what `missing` makes of it; other errors pass. */
export function specOrElse(
  specs: SpecCatalog,
  tenant: string,
  id: string,
  version: number | undefined,
  missing: (notFound: AppError) => Error,
): ReturnType<SpecCatalog['get']> {
  try {
    return specs.get(tenant, id, version);
  } catch (err) {
    if (err instanceof AppError && err.code === 'not_found') throw missing(err);
    throw err;
  }
}
