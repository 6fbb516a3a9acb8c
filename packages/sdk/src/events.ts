/**
 * Reading a Server-Sent Events stream (GET /v1/sandboxes/:id/events) over fetch, so the bearer
 * key travels in the Authorization header: the browser's EventSource cannot send one. Works in
 * Node 20 and in browsers alike; eventsource-parser does the framing (ids, multi-line data,
 * comments, retry fields).
 */
import { createParser, type EventSourceMessage } from 'eventsource-parser';
import { SvcError } from './client.ts';

/** One message of a sandbox's stream: `{event_type, data}` plus the message's `id:`. */
export interface SandboxEvent {
  id?: string;
  event_type: string;
  data: Record<string, unknown>;
}

/** The most of one message held while it arrives: a line that never ends must not fill memory. */
export const MAX_MESSAGE_CHARS = 16 * 1024 * 1024;

/** Yields the messages of an SSE response body as they arrive, until the stream ends. */
export async function* sseMessages(body: ReadableStream<Uint8Array>): AsyncGenerator<EventSourceMessage> {
  const queue: EventSourceMessage[] = [];
  const parser = createParser({
    onEvent: (message) => queue.push(message),
    maxBufferSize: MAX_MESSAGE_CHARS,
    onError: (err) => {
      if (err.type === 'max-buffer-size-exceeded')
        throw new SvcError(200, 'answer_too_large', `a message of the event stream is over ${MAX_MESSAGE_CHARS} characters; the client stopped reading it`);
    },
  });
  const decoder = new TextDecoder();
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      while (queue.length > 0) yield queue.shift()!;
    }
    parser.feed(decoder.decode());
    while (queue.length > 0) yield queue.shift()!;
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => {});
  }
}

/** The sandbox events of an SSE response body, parsed from each message's JSON `data:`. */
export async function* sandboxEvents(body: ReadableStream<Uint8Array>): AsyncGenerator<SandboxEvent> {
  for await (const message of sseMessages(body)) {
    let parsed: { event_type?: unknown; data?: unknown };
    try {
      parsed = JSON.parse(message.data) as { event_type?: unknown; data?: unknown };
    } catch {
      continue; // not one of ours: the stream only carries JSON messages
    }
    if (typeof parsed.event_type !== 'string') continue;
    yield { ...(message.id !== undefined && { id: message.id }), event_type: parsed.event_type, data: (parsed.data ?? {}) as Record<string, unknown> };
  }
}
