/**
 * Event shapes of the terminal topics: svc.terminal-input (api -> runner) and
 * svc.terminal-output (runner -> api). The .avsc files in schemas/ are the source of truth.
 */

/** A value of svc.terminal-input (schemas/terminal-input.avsc). */
export interface TerminalInput {
  tenant: string;
  event_id: string;
  ts: number;
  session_id: string;
  sandbox_id: string;
  seq: number;
  kind: 'input' | 'resize' | 'ack' | 'ping' | 'close';
  data_sealed: Buffer | null;
  cols: number;
  rows: number;
  bytes: number;
  reason: string | null;
}

/** A value of svc.terminal-output (schemas/terminal-output.avsc). */
export interface TerminalOutput {
  tenant: string;
  event_id: string;
  ts: number;
  session_id: string;
  sandbox_id: string;
  seq: number;
  kind: 'output' | 'ack' | 'end';
  data_sealed: Buffer | null;
  bytes: number;
  exit_code: number | null;
  error: string | null;
  reason: string | null;
}
