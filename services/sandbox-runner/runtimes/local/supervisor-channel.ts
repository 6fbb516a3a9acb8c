/**
 * The host's end of the supervisor's framed protocol (supervisor/supervisor.c, "Protocol"): two
 * inherited pipes, requests on the supervisor's fd 3 and replies on its fd 4. Every frame is
 * u32 length (of what follows), u8 type, u32 command id, payload; both ends are on one machine,
 * so native (little-endian) byte order. LocalSandbox (local-sandbox.ts) sends the frames and
 * hands those of a command or a terminal (local-terminal.ts) to it by id.
 */
import type { Readable, Writable } from 'node:stream';

// frame types, as in supervisor.c
// host -> supervisor
export const T_EXEC = 1;
export const T_KILL = 2;
export const T_KILLALL = 3;
export const T_TERMINAL = 4;
export const T_INPUT = 5;
export const T_RESIZE = 6;
export const T_ACK = 7;
export const T_HANGUP = 8;
// supervisor -> host
export const T_READY = 10;
export const T_STARTED = 11;
export const T_STDOUT = 12;
export const T_STDERR = 13;
export const T_EXIT = 14;
export const T_ERROR = 15;
export const T_KILLED = 16;
export const T_TAKEN = 17;

export class SupervisorChannel {
  private buffer: Buffer = Buffer.alloc(0);

  constructor(
    private readonly requests: Writable,
    replies: Readable,
    private readonly onFrame: (type: number, id: number, payload: Buffer) => void,
  ) {
    this.requests.on('error', () => {});
    replies.on('data', (chunk: Buffer) => this.onData(chunk));
    replies.on('error', () => {});
  }

  send(type: number, id: number, payload: Buffer = Buffer.alloc(0)): void {
    const header = Buffer.alloc(9);
    header.writeUInt32LE(payload.length + 5, 0);
    header.writeUInt8(type, 4);
    header.writeUInt32LE(id, 5);
    this.requests.write(payload.length ? Buffer.concat([header, payload]) : header);
  }

  /** Closes the requests' pipe: the host closed the channel, so the sandbox ends (supervisor.c). */
  end(): void {
    this.requests.end();
  }

  private onData(chunk: Buffer): void {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk;
    let off = 0;
    while (this.buffer.length - off >= 4) {
      const len = this.buffer.readUInt32LE(off);
      if (this.buffer.length - off < 4 + len) break;
      const type = this.buffer.readUInt8(off + 4);
      const id = this.buffer.readUInt32LE(off + 5);
      this.onFrame(type, id, this.buffer.subarray(off + 9, off + 4 + len));
      off += 4 + len;
    }
    this.buffer = off === this.buffer.length ? Buffer.alloc(0) : this.buffer.subarray(off);
  }
}
