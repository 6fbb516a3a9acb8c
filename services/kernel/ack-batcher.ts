/**
 * The receiving end of a flow-controlled stream: it acknowledges what it has consumed, but not
 * byte by byte. An acknowledgement goes once a quarter of the sender's window has been taken
 * (so the sender never stalls waiting for one), or `delayMs` after the first byte not yet
 * acknowledged (so a trickle is acknowledged too).
 */
export class AckBatcher {
  private owed = 0;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly window: number,
    private readonly delayMs: number,
    private readonly send: (bytes: number) => void,
  ) {}

  consumed(bytes: number): void {
    this.owed += bytes;
    if (this.owed >= this.window / 4) this.flush();
    else if (this.owed > 0 && !this.timer) this.timer = setTimeout(() => this.flush(), this.delayMs);
  }

  /** Stops for good: nothing more is acknowledged. */
  stop(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.owed = 0;
  }

  private flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const bytes = this.owed;
    this.owed = 0;
    if (bytes > 0) this.send(bytes);
  }
}
