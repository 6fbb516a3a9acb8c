/** test/tiers.mjs: each tier's folders under test/. */
export declare const TIERS: Record<'unit' | 'slow' | 'contract' | 'e2e', string[]>;
export declare const WITHOUT_BACKENDS: string[];
