/** A free TCP port on the loopback (no backend needed: suites that bring their own may import it). */
import net from 'node:net';

/**
 * Below the kernel's ephemeral range (32768 and up by default): a port chosen here is not also
 * handed to one of the many sockets that processes bind to port 0 (a service's egress gateway,
 * clients) between the choice and the service's own listen.
 */
const LOW = 20_000;
const HIGH = 32_000;

export async function freePort(): Promise<number> {
  for (let attempt = 0; attempt < 100; attempt++) {
    const port = LOW + Math.floor(Math.random() * (HIGH - LOW));
    const free = await new Promise<boolean>((resolve) => {
      const srv = net.createServer();
      srv.once('error', () => resolve(false));
      srv.listen(port, '127.0.0.1', () => srv.close(() => resolve(true)));
    });
    if (free) return port;
  }
  throw new Error(`no free port between ${LOW} and ${HIGH}`);
}

/** A listener on the host's loopback that counts the connections it gets (a sandbox must reach none). */
export async function countingListener(): Promise<{ port: number; connections(): number; close(): void }> {
  let connections = 0;
  const server = net.createServer((socket) => {
    connections++;
    socket.destroy();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { port: (server.address() as net.AddressInfo).port, connections: () => connections, close: () => server.close() };
}
