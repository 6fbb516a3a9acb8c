/**
 * Ingress: a port published from a sandbox (`ingress.allow`) is a TCP listener on the host that
 * relays each connection to the sandbox's address and port. Bytes pass untouched; each direction
 * ends on its own (a client that shuts down its sending side still reads the reply), and an
 * error on either side destroys both, so the peer sees the connection go instead of a hang.
 */
import net from 'node:net';

export interface PublishedPort {
  /** Where the port is reachable on the host. */
  host: string;
  port: number;
  /** Stops listening and cuts every open connection. */
  close(): Promise<void>;
}

export async function publishPort(target: { host: string; port: number }, bind: { host: string; port?: number }): Promise<PublishedPort> {
  const open = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true }, (client) => {
    const upstream = net.connect({ host: target.host, port: target.port, allowHalfOpen: true });
    open.add(client);
    open.add(upstream);
    relay(client, upstream);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host: bind.host, port: bind.port ?? 0 }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', () => {}); // after listening: accept errors (EMFILE, ...) are per connection
  const address = server.address() as net.AddressInfo;
  let closing: Promise<void> | null = null;
  return {
    host: address.address,
    port: address.port,
    close() {
      closing ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        for (const socket of open) socket.destroy();
        open.clear();
      });
      return closing;
    },
  };

  /**
   * Pipes a and b both ways; forgets them once closed. A socket closes cleanly only once both of
   * its directions are done, so its peer then just finishes writing and goes.
   */
  function relay(a: net.Socket, b: net.Socket): void {
    a.pipe(b);
    b.pipe(a);
    for (const [self, other] of [
      [a, b],
      [b, a],
    ] as const) {
      self.on('error', () => other.destroy());
      self.on('close', (hadError) => {
        open.delete(self);
        if (hadError) other.destroy();
        else if (!other.destroyed) other.end(() => other.destroy());
      });
    }
  }
}
