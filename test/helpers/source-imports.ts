/** The relative import specifiers of a source text: static import/export, import(), require(). */
export function relativeImports(source: string): string[] {
  const found: string[] = [];
  const patterns = [
    /\bfrom\s*(['"])(\.{1,2}\/[^'"]+)\1/g,
    /\bimport\s*\(\s*(['"])(\.{1,2}\/[^'"]+)\1\s*\)/g,
    /\brequire\s*\(\s*(['"])(\.{1,2}\/[^'"]+)\1\s*\)/g,
    /^\s*import\s*(['"])(\.{1,2}\/[^'"]+)\1/gm,
  ];
  for (const pattern of patterns) for (const m of source.matchAll(pattern)) found.push(m[2]);
  return found;
}
