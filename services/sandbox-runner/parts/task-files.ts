/** Task-file bundles (kernel/bundles.ts) copied into a workspace: the setup's and the grader's. */
import type { ExtractedBundles } from '../../kernel/bundles.ts';
import type { SpecBundleCopy } from '../../domain/spec.ts';
import { copyTreeIn } from '../workspace/files.ts';

/** Copies a task-file bundle into the workspace under its `to`; returns the workspace paths of its top-level names. */
export async function copyBundle(taskFiles: ExtractedBundles, workspace: string, bundle: SpecBundleCopy, field: string): Promise<string[]> {
  const dir = await taskFiles.ensure(bundle.digest);
  return copyTreeIn(workspace, dir, bundle.to, { field: `${field}.to` });
}
