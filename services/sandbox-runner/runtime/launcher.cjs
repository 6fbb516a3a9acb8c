// The launcher: a small, long-lived child process that starts sandbox supervisors for the
// runner. Forking costs time in proportion to the forking process's memory: about 1.5 ms from
// this small process, about 40 ms from the service (chDB makes it large). The child's pipes are
// handed back to the runner over the IPC channel, so the runner talks to the supervisor
// directly. Plain CommonJS: it runs without the TypeScript loader.
'use strict';
const { spawn } = require('node:child_process');

const children = new Map();

process.on('message', (m) => {
  if (m.op === 'spawn') {
    let child;
    try {
      child = spawn(m.command, m.args, { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe', 'pipe'] });
    } catch (err) {
      process.send({ id: m.id, error: err.message });
      return;
    }
    children.set(m.id, child);
    child.on('error', (err) => process.send({ id: m.id, error: err.message }));
    child.on('exit', (code, signal) => {
      children.delete(m.id);
      process.send({ id: m.id, exit: { code, signal } });
    });
    if (child.pid === undefined) return;
    process.send({ id: m.id, pid: child.pid });
    for (const fd of [2, 3, 4, 5]) process.send({ id: m.id, fd }, child.stdio[fd]);
  } else if (m.op === 'kill') {
    children.get(m.id)?.kill(m.signal);
  }
});
// The runner is gone: so are we (and, through their parent-death signal, the supervisors).
process.on('disconnect', () => process.exit(0));
