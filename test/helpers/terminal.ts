/**
 * A real terminal for the CLI tests: tmux (Debian's, listed in infra/sandbox-packages.txt) runs a
 * command in a pane of its own server (a private socket, so nothing touches the user's tmux), the
 * test types with send-keys and reads the screen with capture-pane, as a person would, and
 * resizes the window as a person dragging it would (the command gets SIGWINCH). The command's
 * exit code is printed behind a marker when it ends, and the pane stays until closed.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';

export const tmuxAvailable = (): boolean => {
  try {
    execFileSync('tmux', ['-V'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
};

const shellQuote = (text: string) => `'${text.replace(/'/g, `'\\''`)}'`;

export interface Terminal {
  /** The screen and its scrollback, as text. */
  screen(): string;
  /** Types text; `enter` presses Enter after it. */
  type(text: string, enter?: boolean): void;
  /** Presses keys by tmux name: `C-c`, `C-d`, `Enter`. */
  keys(...names: string[]): void;
  /** The pane's size in characters (the window's, less tmux's status line). */
  size(): { cols: number; rows: number };
  /** Resizes the window to `cols` x `rows` characters. */
  resize(cols: number, rows: number): void;
  /** Waits until the screen matches `pattern`; returns the screen. */
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<string>;
  /** Waits for the command to end; its exit code and the screen. */
  exit(timeoutMs?: number): Promise<{ code: number; screen: string }>;
  close(): void;
}

const EXIT_MARKER = /\[svc-test exit (\d+)\]/;

/** Runs `command` (a shell line) in a new 200x50 terminal with `env` and `cwd`. */
export function terminal(command: string, options: { env?: Record<string, string>; cwd?: string } = {}): Terminal {
  const socket = `svc-test-${randomBytes(4).toString('hex')}`;
  const tmux = (...args: string[]) => execFileSync('tmux', ['-L', socket, ...args], { encoding: 'utf8' });
  const env = Object.entries(options.env ?? {})
    .map(([k, v]) => `${k}=${shellQuote(v)}`)
    .join(' ');
  // Ctrl-C reaches the whole foreground group: the wrapping shell traps it (a handler, which its
  // child does not inherit, unlike an ignored signal) to live on and print the exit code.
  const line = `trap true INT; cd ${shellQuote(options.cwd ?? process.cwd())} && env ${env} ${command}; echo "[svc-test exit $?]"; sleep 600`;
  execFileSync('tmux', ['-L', socket, '-f', '/dev/null', 'new-session', '-d', '-s', 'main', '-x', '200', '-y', '50', 'sh', '-c', line], {
    env: { ...process.env, TERM: 'xterm-256color' },
  });
  tmux('set-option', '-g', 'history-limit', '20000');
  const screen = () => tmux('capture-pane', '-p', '-J', '-S', '-20000', '-t', 'main');
  const waitFor = async (pattern: RegExp, timeoutMs = 60_000) => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const text = screen();
      if (pattern.test(text)) return text;
      if (Date.now() > deadline) throw new Error(`the terminal never showed ${pattern} within ${timeoutMs} ms; it shows:\n${text}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  return {
    screen,
    type: (text, enter = true) => {
      tmux('send-keys', '-t', 'main', '-l', text);
      if (enter) tmux('send-keys', '-t', 'main', 'Enter');
    },
    keys: (...names) => {
      tmux('send-keys', '-t', 'main', ...names);
    },
    size: () => {
      const [cols, rows] = tmux('display-message', '-p', '-t', 'main', '#{pane_width} #{pane_height}').trim().split(' ').map(Number);
      return { cols, rows };
    },
    resize: (cols, rows) => {
      tmux('resize-window', '-t', 'main', '-x', String(cols), '-y', String(rows));
    },
    waitFor,
    exit: async (timeoutMs = 60_000) => {
      const text = await waitFor(EXIT_MARKER, timeoutMs);
      return { code: Number(EXIT_MARKER.exec(text)![1]), screen: text };
    },
    close: () => {
      try {
        tmux('kill-server');
      } catch {
        // already gone
      }
    },
  };
}
