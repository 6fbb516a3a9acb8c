/**
 * Red team: socket families. AF_VSOCK sockets were allowed inside the sandbox, and vsock goes past
 * the network namespace: a connection to CID 2 reached the hypervisor. The commands' seccomp filter
 * (services/sandbox-runner/runtimes/local/supervisor/supervisor.c) now allows socket() only for AF_UNIX, AF_INET, AF_INET6 and
 * netlink's route and diagnostics protocols (ip, ss), and socketpair() only for AF_UNIX; the rest
 * fail with EAFNOSUPPORT (EPROTONOSUPPORT for other netlink protocols). What commands need still works.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { LocalRuntime } from '../../services/sandbox-runner/runtimes/local/local-runtime.ts';
import type { SandboxHandle } from '../../services/sandbox-runner/runtimes/runtime.ts';
import { backend } from '../helpers/backend.ts';

const EAFNOSUPPORT = os.constants.errno.EAFNOSUPPORT;
const EPROTONOSUPPORT = os.constants.errno.EPROTONOSUPPORT;

/** Tries each socket in the sandbox; prints {name: "ok" | errno}. */
const PROBE = `
import json, socket, errno
def attempt(make):
    try:
        s = make()
        for x in (s if isinstance(s, tuple) else (s,)):
            x.close()
        return "ok"
    except OSError as e:
        return e.errno
AF_ALG, AF_KEY, AF_BLUETOOTH, NETLINK_KOBJECT_UEVENT, NETLINK_AUDIT = 38, 15, 31, 15, 9
print(json.dumps({
    "vsock": attempt(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)),
    "vsock_dgram": attempt(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_DGRAM)),
    "packet": attempt(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)),
    "alg": attempt(lambda: socket.socket(AF_ALG, socket.SOCK_SEQPACKET, 0)),
    "key": attempt(lambda: socket.socket(AF_KEY, socket.SOCK_RAW, 2)),
    "bluetooth": attempt(lambda: socket.socket(AF_BLUETOOTH, socket.SOCK_STREAM, 0)),
    "netlink_uevent": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_KOBJECT_UEVENT)),
    "netlink_audit": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_AUDIT)),
    "socketpair_inet": attempt(lambda: socket.socketpair(socket.AF_INET)),
    "unix": attempt(lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)),
    "unix_pair": attempt(lambda: socket.socketpair(socket.AF_UNIX)),
    "inet": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM)),
    "inet6": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)),
    "netlink_route": attempt(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)),
}))
`;

const runtimeOk = backend('SVC_TEST_BWRAP', 'red team: socket families');

if (runtimeOk) {
  describe('red team: only the socket families a command needs', () => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-sockets-'));
    const runtime = new LocalRuntime({ stateDir: path.join(root, 'state') });
    let sb: SandboxHandle;

    before(async () => {
      const unavailable = await runtime.available();
      assert.equal(unavailable, null, unavailable ?? '');
      const id = `sb-${randomBytes(6).toString('hex')}`;
      const workspace = path.join(root, 'workspaces', id);
      fs.mkdirSync(workspace, { recursive: true });
      sb = await runtime.create({ id, workspace, rootfs: null, env: {}, resources: { memoryBytes: 256 * 1024 * 1024, cpus: 1, pids: 128, diskBytes: null } });
    });
    after(async () => {
      await sb?.destroy();
      await runtime.close();
      fs.rmSync(root, { recursive: true, force: true });
    });

    test('AF_VSOCK, AF_PACKET, AF_ALG, AF_KEY, AF_BLUETOOTH and other netlink protocols are refused; socketpair is AF_UNIX only', async () => {
      const r = await sb.exec({ command: `python3 -c '${PROBE}'` });
      assert.equal(r.exitCode, 0, r.stderr);
      const got = JSON.parse(r.stdout) as Record<string, string | number>;
      for (const family of ['vsock', 'vsock_dgram', 'packet', 'alg', 'key', 'bluetooth', 'socketpair_inet']) {
        assert.equal(got[family], EAFNOSUPPORT, `${family}: ${JSON.stringify(got)}`);
      }
      for (const protocol of ['netlink_uevent', 'netlink_audit']) assert.equal(got[protocol], EPROTONOSUPPORT, `${protocol}: ${JSON.stringify(got)}`);
    });

    test('AF_UNIX, AF_INET, AF_INET6 and netlink routes still work: a TCP round trip on loopback, ip', async () => {
      const r = await sb.exec({ command: `python3 -c '${PROBE}'` });
      const got = JSON.parse(r.stdout) as Record<string, string | number>;
      for (const family of ['unix', 'unix_pair', 'inet', 'inet6', 'netlink_route']) assert.equal(got[family], 'ok', `${family}: ${JSON.stringify(got)}`);
      const tcp = await sb.exec({
        command: `python3 -c '
import socket, threading
srv = socket.socket(socket.AF_INET6); srv.bind(("::1", 0)); srv.listen(1)
def serve():
    c, _ = srv.accept(); c.sendall(c.recv(10).upper()); c.close()
threading.Thread(target=serve).start()
cli = socket.create_connection(("::1", srv.getsockname()[1])); cli.sendall(b"ping"); print(cli.recv(10).decode())
'`,
      });
      assert.equal(tcp.stdout, 'PING\n', tcp.stderr);
      const ip = await sb.exec({ command: 'ip -o link show lo && ip -o addr show lo' });
      assert.equal(ip.exitCode, 0, ip.stderr);
      assert.match(ip.stdout, /127\.0\.0\.1/);
    });
  });
}
