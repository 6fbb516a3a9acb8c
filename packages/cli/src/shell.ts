/**
 * The client of a sandbox shell (GET /v1/sandboxes/:id/shell, a WebSocket; the server side is
 * services/api/routes/sandbox-shell.ts): a real terminal on the sandbox's shell. On a TTY, stdin
 * goes raw, so every key (Ctrl-C, Ctrl-Z, Tab, arrows) reaches the shell and its programs, and
 * the window's size goes with the connection and again on each SIGWINCH; the terminal is
 * restored however the session ends. Without a TTY the bytes are piped as they are, and the end
 * of stdin is an end of file (Ctrl-D) to the shell. It resolves with the shell's exit code.
 *
 * A Ctrl-D typed ahead can be lost: the kernel takes it as an end of file while the terminal is
 * in line mode (a command running), and a line editor that switches the mode before reading it
 * (bash's readline, at its next prompt) reads a NUL instead. So after the input's end, a Ctrl-U
 * and Ctrl-D go again whenever the terminal has been quiet a moment, until the shell exits: one
 * arrives while the shell waits at its prompt.
 *
 * Both ways are back-pressured: stdin is read no faster than the socket sends, and the socket no
 * faster than stdout takes the output (the service then holds the shell).
 */
import WebSocket from 'ws';
import { CliError, EXIT } from './errors.ts';

interface ShellOptions {
  baseUrl: string;
  apiKey: string;
  sandboxId: string;
  timeout?: string;
}

type Control =
  | { type: 'ready'; sandbox_id: string; session_id: string; shell: string }
  | { type: 'exit'; exit_code: number }
  | { type: 'error'; error: string; message: string };

/** Input waiting in the socket past this: stdin is read no more until it has gone. */
const SEND_HIGH_WATER = 256 * 1024;
/** The end of file of a terminal (what Ctrl-D types), and the same after a Ctrl-U, which empties a line first. */
const EOF = Buffer.from([4]);
const EOF_AGAIN = Buffer.from([0x15, 4]);
/** The largest frame taken from the service (its output frames are at most 64 KiB), and the most of a refusal's body read. */
const MAX_FRAME_BYTES = 1024 * 1024;
const MAX_REFUSAL_BYTES = 64 * 1024;

/** A text frame's JSON control, or null for one that is not (a service in error, or a hostile one). */
function controlOf(data: WebSocket.RawData): Partial<Control> | null {
  try {
    const frame: unknown = JSON.parse(String(data));
    return frame !== null && typeof frame === 'object' ? (frame as Partial<Control>) : null;
  } catch {
    return null;
  }
}

/** How long the terminal is quiet before a piped session's end of file is sent again. */
const QUIET_MS = 300;

/** The terminal's size, when there is a terminal. */
function windowSize(): { cols: number; rows: number } | null {
  const tty = process.stdout.isTTY ? process.stdout : process.stderr.isTTY ? process.stderr : null;
  return tty && tty.columns > 0 && tty.rows > 0 ? { cols: tty.columns, rows: tty.rows } : null;
}

function shellUrl({ baseUrl, sandboxId, timeout }: ShellOptions): string {
  const url = new URL(`${baseUrl}/v1/sandboxes/${encodeURIComponent(sandboxId)}/shell`);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  const size = windowSize();
  if (size) {
    url.searchParams.set('cols', String(Math.min(size.cols, 1000)));
    url.searchParams.set('rows', String(Math.min(size.rows, 1000)));
  }
  // The service refuses a TERM it cannot pass on; its default (xterm-256color) stands in.
  const term = process.env.TERM;
  if (term && /^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$/.test(term)) url.searchParams.set('term', term);
  if (timeout) url.searchParams.set('timeout', timeout);
  return url.toString();
}

type Message = { data: WebSocket.RawData; isBinary: boolean };

/**
 * Connects; rejects with the service's one-line error when it refuses the upgrade. Resolves at
 * the ready frame with what came after it meanwhile (the shell's first output may share its
 * packet), still collecting until `detach`.
 */
function connect(options: ShellOptions): Promise<{ ws: WebSocket; early: Message[]; detach: () => void }> {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(shellUrl(options), { headers: { authorization: `Bearer ${options.apiKey}` }, maxPayload: MAX_FRAME_BYTES });
    const early: Message[] = [];
    let ready = false;
    const onMessage = (data: WebSocket.RawData, isBinary: boolean) => {
      if (ready) return void early.push({ data, isBinary });
      const frame = isBinary ? null : controlOf(data);
      if (frame?.type !== 'ready') return reject(new CliError(`the shell did not start: ${isBinary ? 'output before ready' : String(data).slice(0, 1000)}`));
      ready = true;
      resolve({ ws, early, detach: () => ws.off('message', onMessage) });
    };
    ws.on('message', onMessage);
    ws.once('unexpected-response', (_req, res) => {
      let text = '';
      res.on('data', (chunk: Buffer) => {
        text += chunk;
        if (text.length > MAX_REFUSAL_BYTES) res.destroy();
      });
      res.on('close', () => {
        text = text.slice(0, MAX_REFUSAL_BYTES);
        let body: { error?: string; message?: string } = {};
        try {
          body = JSON.parse(text) as typeof body;
        } catch {
          // not JSON
        }
        reject(new CliError(`${res.statusCode} ${body.error ?? 'http_error'}: ${body.message ?? (text || res.statusMessage)}`));
      });
    });
    ws.once('error', (err) =>
      reject(err.message.includes('ECONNREFUSED') ? new CliError(`cannot reach the service at ${options.baseUrl}: ${err.message}`) : err),
    );
  });
}

/** Runs the session; resolves with the shell's exit code (1 when the session ended without one). */
export async function openShell(options: ShellOptions): Promise<number> {
  const { ws, early, detach } = await connect(options);
  const { stdin, stdout } = process;
  const raw = stdin.isTTY === true;
  const restore = () => {
    if (raw && stdin.isRaw) stdin.setRawMode(false);
  };
  if (raw) stdin.setRawMode(true);
  process.once('exit', restore);

  return new Promise<number>((resolve) => {
    let exitCode: number | null = null;
    const onResize = () => {
      const size = windowSize();
      if (size && ws.readyState === ws.OPEN) ws.send(JSON.stringify({ type: 'resize', cols: Math.min(size.cols, 1000), rows: Math.min(size.rows, 1000) }));
    };
    const onInput = (chunk: Buffer) => {
      ws.send(chunk, { binary: true }, () => {
        if (ws.bufferedAmount < SEND_HIGH_WATER / 2) stdin.resume();
      });
      if (ws.bufferedAmount > SEND_HIGH_WATER) stdin.pause();
    };
    let outputAt = Date.now();
    let again: NodeJS.Timeout | null = null;
    const onEnd = () => {
      if (ws.readyState !== ws.OPEN) return;
      ws.send(EOF, { binary: true });
      again = setInterval(() => {
        if (Date.now() - outputAt >= QUIET_MS && ws.readyState === ws.OPEN) ws.send(EOF_AGAIN, { binary: true });
      }, QUIET_MS);
    };
    process.on('SIGWINCH', onResize);
    stdin.on('data', onInput);
    stdin.on('end', onEnd);
    stdin.resume();

    const onMessage = (data: WebSocket.RawData, isBinary: boolean) => {
      if (isBinary) {
        outputAt = Date.now();
        if (!stdout.write(data as Buffer)) {
          ws.pause();
          stdout.once('drain', () => ws.resume());
        }
        return;
      }
      const frame = controlOf(data);
      if (frame?.type === 'exit' && Number.isInteger(frame.exit_code)) exitCode = frame.exit_code!;
      // In raw mode a line needs its carriage return.
      else if (frame?.type === 'error') process.stderr.write(`${raw ? '\r\n' : ''}svc: ${String(frame.error)}: ${String(frame.message)}${raw ? '\r' : ''}\n`);
    };
    detach();
    ws.on('message', onMessage);
    for (const { data, isBinary } of early) onMessage(data, isBinary);
    ws.on('error', () => ws.terminate());
    ws.on('close', (code, reason) => {
      if (again) clearInterval(again);
      process.off('SIGWINCH', onResize);
      stdin.off('data', onInput);
      stdin.off('end', onEnd);
      stdin.pause();
      restore();
      if (exitCode === null && code !== 1000)
        process.stderr.write(`svc: the shell's connection closed (${code}${String(reason) ? `: ${String(reason)}` : ''})\n`);
      resolve(exitCode ?? EXIT.failed);
    });
  });
}
