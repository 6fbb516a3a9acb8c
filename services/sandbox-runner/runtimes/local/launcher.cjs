// The launcher: a small, long-lived child process that starts sandbox supervisors for the
// runner. Forking costs time in proportion to the forking process's memory: about 1.5 ms from
// this small process, about 40 ms from the service (chDB makes it large). The child's pipes are
// handed back to the runner over the IPC channel, so the runner talks to the supervisor
// directly. Plain CommonJS: it runs without the TypeScript loader.
'use strict';
const { execFile, execFileSync, spawn } = require('node:child_process');

const children = new Map();
/** key -> {command, args}: what undoes a `run` (a workspace's mount) should the runner die first. */
const undo = new Map();
/** The `run` commands still running. */
const running = new Set();

/** A message to the runner; a channel already closed (the runner gone) is not an error here. */
function tell(message, handle) {
  if (!process.connected) return;
  process.send(message, handle, (err) => {
    if (err && process.connected) process.stderr.write(`launcher: could not tell the runner (${err.message})\n`);
  });
}

// The launcher holds what undoes the runner's mounts should the runner die: one failed message
// must not take that with it (a new launcher would not know them). Said, then carried on.
process.on('uncaughtException', (err) => process.stderr.write(`launcher: ${err.stack || err}\n`));

process.on('message', (m) => {
  if (m.op === 'spawn') {
    // {pidOf: id}: the pid of a process spawned before this one (still running).
    const args = m.args.map((a) => (typeof a === 'string' ? a : children.get(a.pidOf)?.pid));
    if (args.includes(undefined)) {
      tell({ id: m.id, error: 'a process its arguments name is not running' });
      return;
    }
    let child;
    try {
      child = spawn(m.command, args.map(String), { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe', 'pipe'] });
    } catch (err) {
      tell({ id: m.id, error: err.message });
      return;
    }
    // Nothing is read here: what the process writes before its pipes reach the runner must stay
    // in them (a read would keep it in this process's buffers, lost when the pipe is handed on).
    for (const fd of [2, 3, 4, 5]) child.stdio[fd]._handle?.readStop();
    children.set(m.id, child);
    child.on('error', (err) => tell({ id: m.id, error: err.message }));
    child.on('exit', (code, signal) => {
      children.delete(m.id);
      tell({ id: m.id, exit: { code, signal } });
    });
    if (child.pid === undefined) return;
    // `fd5`: written here at once (and fd 5 closed), so the process need not wait for its pipes to reach the runner.
    const handed = m.fd5 === undefined ? [2, 3, 4, 5] : [2, 3, 4];
    if (m.fd5 !== undefined) child.stdio[5].on('error', () => {}).end(m.fd5);
    tell({ id: m.id, pid: child.pid, pipes: handed.length });
    for (const fd of handed) tell({ id: m.id, fd }, child.stdio[fd]);
  } else if (m.op === 'kill') {
    children.get(m.id)?.kill(m.signal);
  } else if (m.op === 'run') {
    // A short command (mkfs, mount): the runner gets its exit and stderr at its end, not its pipes.
    // The undo is kept from the start: should the runner die while this runs, it is undone anyway
    // (a no-op when the command never got that far); dropped if the command fails.
    if (m.undo) undo.set(m.undo.key, m.undo);
    const child = execFile(m.command, m.args, { timeout: m.timeoutMs, killSignal: 'SIGKILL', maxBuffer: 4 * 1024 * 1024 }, (err, stdout, stderr) => {
      running.delete(child);
      const code = err ? (typeof err.code === 'number' ? err.code : null) : 0;
      if (code !== 0 && m.undo) undo.delete(m.undo.key);
      const text = String(stderr || (err && code === null && !err.signal ? err.message : ''));
      tell({ id: m.id, ran: { code, signal: err?.signal ?? null, stderr: text.slice(-4096), stdout: m.stdout ? String(stdout) : '' } });
    });
    running.add(child);
  } else if (m.op === 'remember') {
    undo.set(m.undo.key, m.undo);
  } else if (m.op === 'forget') {
    undo.delete(m.key);
  }
});
// The runner is gone: so are we (and, through their parent-death signal, the supervisors). What
// it could not undo itself (a killed runner leaves its workspaces mounted) is undone first.
// 'disconnect' says so; the parent changing says so too, should the channel's close be missed
// (a launcher outliving its runner would keep the runner's sandboxes running).
let leaving = false;
function runnerGone() {
  if (leaving) return;
  leaving = true;
  // A mount still running would hold libmount's lock against the unmounts below: it ends first.
  for (const child of running) child.kill('SIGKILL');
  for (const { command, args } of undo.values()) {
    try {
      execFileSync(command, args, { stdio: 'ignore', timeout: 5000 });
    } catch {
      // the next start's sweep of the state directory catches it
    }
  }
  process.exit(0);
}
process.on('disconnect', runnerGone);
const runner = process.ppid;
setInterval(() => {
  if (process.ppid !== runner) runnerGone();
}, 1000).unref();
