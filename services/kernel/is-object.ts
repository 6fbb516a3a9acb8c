/** A plain JSON object (not null, not an array): what parsed JSON and YAML mappings are. */
export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
