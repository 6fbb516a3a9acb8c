/** One shell word for `sh -c` text: single-quoted, with single quotes inside escaped. */
export function shellQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}
