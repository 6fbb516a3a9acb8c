/**
 * The files API of a sandbox (read, write, delete in its workspace): the service's own work,
 * audited here as the API's, not as the agent's (the file watch is told to ignore it), through
 * the path-safe layer (workspace/files.ts): the agent may be racing it.
 */
import type { FileWritePayload, OpAnswer } from '../../domain/sandbox-ops.ts';
import { deleteFile, readFile, writeFile } from '../workspace/files.ts';
import { resolveWorkspacePath } from '../workspace/paths.ts';
import type { ActivityCapture } from './activity-capture.ts';
import type { AuditTrail } from './audit-trail.ts';
import type { SandboxBox } from './sandbox-box.ts';

export class FilesApi {
  constructor(
    private readonly box: SandboxBox,
    private readonly capture: ActivityCapture,
    private readonly trail: AuditTrail,
  ) {}

  /** A file of the workspace, as bytes. */
  async read(payload: { path: string }): Promise<OpAnswer<'file_read'>> {
    const { path: relative, content, bytes } = await readFile(this.box.workspace, payload.path);
    await this.trail.log!.record('file_read', { path: relative, bytes });
    return { body: content, contentType: 'application/octet-stream' };
  }

  /**
   * API writes are audited here, not as the agent's own activity: the watcher is told to ignore
   * them. `content` is text, or base64 with `encoding: base64` (the api checked both, and `mode`).
   */
  async write(payload: FileWritePayload): Promise<OpAnswer<'file_write'>> {
    const workspace = this.box.workspace;
    const { relative } = resolveWorkspacePath(workspace, payload.path);
    const content = payload.encoding === 'base64' ? Buffer.from(String(payload.content), 'base64') : payload.content;
    const mode = typeof payload.mode === 'number' ? payload.mode : undefined;
    const { bytes } = await this.capture.unwatched({ paths: [relative] }, () => writeFile(workspace, payload.path, content, { mode }));
    await this.trail.log!.record('file_write', { path: relative, bytes });
    return { status: 201, body: { path: relative, bytes } };
  }

  async delete(payload: { path: string }): Promise<OpAnswer<'file_delete'>> {
    const workspace = this.box.workspace;
    const { relative } = resolveWorkspacePath(workspace, payload.path);
    const { bytes } = await this.capture.unwatched({ paths: [relative] }, () => deleteFile(workspace, payload.path));
    await this.trail.log!.record('file_delete', { path: relative, bytes });
    return { body: { path: relative, deleted: true } };
  }
}
