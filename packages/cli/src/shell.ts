/**
 * The client of a sandbox shell (GET /v1/sandboxes/:id/shell, a WebSocket; the server side is
 * services/api/routes/sandbox-shell.ts). Lines come from readline (history and editing on a
 * terminal, or a pipe), run one at a time, and print their stdout and stderr as the sandbox
 * gave them. `exit` or Ctrl-D ends the session; its exit code is the last command's.
 */
import { createInterface } from 'node:readline';
import WebSocket from 'ws';
import { CliError } from './errors.ts';

interface ShellOptions {
  baseUrl: string;
  apiKey: string;
  sandboxId: string;
  timeout?: string;
}

type Frame =
  | { type: 'ready'; sandbox_id: string; cwd: string }
  | { type: 'result'; stdout: string; stderr: string; exit_code: number; cwd: string; timed_out?: boolean }
  | { type: 'error'; error: string; message: string };

function shellUrl({ baseUrl, sandboxId, timeout }: ShellOptions): string {
  const url = new URL(`${baseUrl}/v1/sandboxes/${encodeURIComponent(sandboxId)}/shell`);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  if (timeout) url.searchParams.set('timeout', timeout);
  return url.toString();
}

/** Connects; rejects with the service's one-line error when it refuses the upgrade. */
function connect(options: ShellOptions): Promise<{ ws: WebSocket; ready: Extract<Frame, { type: 'ready' }> }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(shellUrl(options), { headers: { authorization: `Bearer ${options.apiKey}` } });
    ws.once('unexpected-response', (_req, res) => {
      let text = '';
      res.on('data', (chunk: Buffer) => (text += chunk));
      res.on('end', () => {
        let body: { error?: string; message?: string } = {};
        try {
          body = JSON.parse(text) as typeof body;
        } catch {
          // not JSON
        }
        reject(new CliError(`${res.statusCode} ${body.error ?? 'http_error'}: ${body.message ?? (text || res.statusMessage)}`));
      });
    });
    ws.once('error', (err) => reject(err.message.includes('ECONNREFUSED') ? new CliError(`cannot reach the service at ${options.baseUrl}: ${err.message}`) : err));
    ws.once('message', (data) => {
      const frame = JSON.parse(String(data)) as Frame;
      if (frame.type === 'ready') resolve({ ws, ready: frame });
      else reject(new CliError(`the shell did not start: ${JSON.stringify(frame)}`));
    });
  });
}

/** Runs the interactive session; resolves with the last command's exit code. */
export async function openShell(options: ShellOptions): Promise<number> {
  const { ws, ready } = await connect(options);
  const tty = process.stdin.isTTY === true;
  let cwd = ready.cwd;
  let lastExit = 0;
  let busy = false;
  let inputEnded = false;
  const queue: string[] = [];
  const rl = createInterface({ input: process.stdin, output: process.stdout, terminal: tty, historySize: 500 });
  const prompt = () => {
    if (!tty) return;
    rl.setPrompt(`${options.sandboxId}:${cwd}$ `);
    rl.prompt();
  };
  if (tty) process.stderr.write(`connected to ${options.sandboxId}; each line runs in the sandbox (no terminal programs); \`exit\` or Ctrl-D leaves\n`);

  return new Promise<number>((resolve) => {
    let finished = false;
    const finish = (code: number) => {
      if (finished) return;
      finished = true;
      rl.close();
      ws.close();
      resolve(code);
    };
    const next = () => {
      if (busy) return;
      const line = queue.shift();
      if (line === undefined) {
        if (inputEnded) finish(lastExit);
        else prompt();
        return;
      }
      if (/^\s*(exit|logout)\s*$/.test(line)) return finish(lastExit);
      if (line.trim() === '') return next();
      busy = true;
      ws.send(JSON.stringify({ type: 'run', command: line }));
    };
    ws.on('message', (data) => {
      const frame = JSON.parse(String(data)) as Frame;
      if (frame.type === 'result') {
        process.stdout.write(frame.stdout);
        process.stderr.write(frame.stderr);
        if (frame.timed_out) process.stderr.write(`(killed by --timeout ${options.timeout ?? ''})\n`);
        cwd = frame.cwd;
        lastExit = frame.exit_code;
      } else if (frame.type === 'error') {
        process.stderr.write(`svc: ${frame.error}: ${frame.message}\n`);
        lastExit = lastExit || 1;
      }
      busy = false;
      next();
    });
    ws.on('close', (_code, reason) => {
      if (finished) return;
      if (String(reason)) process.stderr.write(`svc: the shell closed: ${String(reason)}\n`);
      finish(lastExit || 1);
    });
    rl.on('line', (line) => {
      queue.push(line);
      next();
    });
    rl.on('close', () => {
      inputEnded = true;
      if (!busy && queue.length === 0) finish(lastExit);
    });
    rl.on('SIGINT', () => {
      if (busy) process.stderr.write('\n^C: the command keeps running in the sandbox until it ends (or --timeout); Ctrl-D leaves after it\n');
      else {
        process.stdout.write('^C\n');
        prompt();
      }
    });
    prompt();
  });
}
