/**
 * Request/reply over the log. A requester appends a request carrying a fresh correlation id to
 * an exchange's request topic, under the caller's key (so one key's requests stay in order on
 * one partition), and awaits the reply with that id on the exchange's reply topic, which every
 * requesting process follows from its tail. No reply in time is a 504 `timeout`, a clear HTTP
 * error. The shapes of requests and replies, and anything done to them on the way (sealing),
 * are the caller's: the exchange says only where they go and how to read a reply's correlation id.
 */
import { subscribe, publish, type Kernel } from './actor.ts';
import { AppError } from './errors.ts';
import { newEventId } from './ids.ts';
import type { Consumer } from './log/event-log.ts';

/** A pair of topics that carry requests and their replies, and how to read a reply. */
export interface Exchange<Reply> {
  /** Where requests are appended, each under the key its caller gives. */
  requests: string;
  /** Where replies come back, keyed by their correlation id. */
  replies: string;
  /** The correlation id of the request a reply answers. */
  correlationOf(reply: Reply): string;
  /** Applied to a reply that a request awaits, as it arrives (e.g. to open a sealed body). @default the reply as it came */
  receive?(reply: Reply): Reply;
}

/** Where one request goes, and what the timeout error says went unanswered. */
export interface Addressee {
  key: string;
  tenant: string;
  /** The start of the timeout's message, which ends "within N s". */
  unanswered: string;
}

/**
 * The requesting side of one exchange. A process has one per exchange: its consumer group is
 * `replies.<instance id>`, follows from the tail and commits nothing.
 */
export class Requester<Request extends object, Reply> {
  private readonly pending = new Map<string, (reply: Reply) => void>();
  private consumer: Consumer | null = null;

  constructor(
    private readonly kernel: Kernel,
    private readonly exchange: Exchange<Reply>,
  ) {}

  async start(): Promise<void> {
    const { correlationOf, receive = (reply: Reply) => reply } = this.exchange;
    this.consumer = await subscribe<Reply>(this.kernel, {
      // A group of its own per exchange: two requesters of one process on one group would split the topics between them.
      groupId: `replies.${this.exchange.replies}.${this.kernel.instanceId}`,
      topics: [this.exchange.replies],
      fromBeginning: false,
      commit: false,
      handle: async (events) => {
        for (const { value } of events) {
          const waiting = value && this.pending.get(correlationOf(value));
          if (waiting) waiting(receive(value));
        }
      },
    });
  }

  async stop(): Promise<void> {
    await this.consumer?.stop();
    this.consumer = null;
  }

  /** Appends the request `build` makes for a new correlation id, and resolves with its reply. */
  async request(to: Addressee, build: (correlationId: string) => Request, timeoutMs = this.kernel.config.replyTimeout): Promise<Reply> {
    const correlationId = newEventId();
    const reply = new Promise<Reply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(correlationId);
        reject(new AppError('timeout', `${to.unanswered} within ${Math.round(timeoutMs / 1000)} s`));
      }, timeoutMs);
      this.pending.set(correlationId, (r) => {
        clearTimeout(timer);
        this.pending.delete(correlationId);
        resolve(r);
      });
    });
    await publish(this.kernel, this.exchange.requests, [{ key: to.key, tenant: to.tenant, value: build(correlationId) }]);
    return reply;
  }
}

/** The answering side: appends a reply to the exchange's reply topic, keyed by its correlation id. */
export async function reply<Reply extends object>(kernel: Kernel, exchange: Exchange<Reply>, tenant: string, value: Reply): Promise<void> {
  await publish(kernel, exchange.replies, [{ key: exchange.correlationOf(value), tenant, value }]);
}
