/**
 * Wrappers for the official `openai` and `@anthropic-ai/sdk` clients. Each create call reports
 * one `llm_call` event and one `tool_use` event per tool call the model made; a streamed call
 * reports when its stream ends. The call's own result (an APIPromise, with `withResponse()` and
 * friends) is returned untouched: the wrapper only observes it.
 */
import { estimateUsd } from './prices.ts';
import { getTracer, newSpanId, toField, type Span, type Tracer } from './tracing.ts';

// Structural shapes, so the SDK needs neither client installed; `never[]` accepts any signature.
type CreateFn = (...args: never[]) => unknown;
export interface OpenAILike {
  chat: { completions: { create: CreateFn } };
}
export interface AnthropicLike {
  messages: { create: CreateFn };
}

export interface WrapOptions {
  tracer?: Tracer;
}

interface ToolCall {
  name: string;
  arguments: string;
}

/** What one finished call says about itself, from a response or from its stream. */
interface CallReport {
  model: string;
  inputTokens: number;
  /** Input tokens not read from the prompt cache, priced at the full rate. */
  uncachedInputTokens: number;
  outputTokens: number;
  cacheReadTokens: number;
  reasoningTokens: number;
  text: string;
  toolCalls: ToolCall[];
}

interface Accumulator {
  add(item: unknown): void;
  report(): CallReport;
}

interface Provider {
  system: 'openai' | 'anthropic';
  fromResponse(response: unknown): CallReport;
  accumulator(): Accumulator;
}

type Obj = Record<string, unknown>;
const obj = (v: unknown): Obj => (typeof v === 'object' && v !== null ? (v as Obj) : {});
const num = (v: unknown): number => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? Math.round(v) : 0);
const str = (v: unknown): string => (typeof v === 'string' ? v : '');
const list = (v: unknown): unknown[] => (Array.isArray(v) ? v : []);

export function wrapOpenAI<T extends OpenAILike>(client: T, options: WrapOptions = {}): T {
  instrument(client.chat.completions, OPENAI, options.tracer);
  return client;
}

export function wrapAnthropic<T extends AnthropicLike>(client: T, options: WrapOptions = {}): T {
  instrument(client.messages, ANTHROPIC, options.tracer);
  return client;
}

function instrument(owner: { create: CreateFn }, provider: Provider, tracer?: Tracer): void {
  const original = owner.create;
  const patched = function (this: unknown, ...args: unknown[]): unknown {
    const result: unknown = Reflect.apply(original, this ?? owner, args);
    const t = tracer ?? getTracer();
    if (!t.enabled || typeof (result as PromiseLike<unknown> | null)?.then !== 'function') return result;
    const params = obj(args[0]);
    const call = { params, parent: t.currentSpan(), ts: new Date().toISOString(), started: performance.now() };
    const report = (r: CallReport | null, error?: unknown) => safely(() => reportCall(t, provider, call, r, error));
    (result as PromiseLike<unknown>).then(
      (value) => {
        if (params.stream === true && typeof (value as { [Symbol.asyncIterator]?: unknown } | null)?.[Symbol.asyncIterator] === 'function') {
          observeStream(value as AsyncIterable<unknown>, provider, report);
        } else {
          report(safely(() => provider.fromResponse(value)) ?? null);
        }
      },
      (err: unknown) => report(null, err),
    );
    return result;
  };
  owner.create = patched as CreateFn;
}

/** Tracing must never throw into the agent. */
function safely<R>(fn: () => R): R | undefined {
  try {
    return fn();
  } catch {
    return undefined;
  }
}

/** Replaces the stream's iterator with one that accumulates items and reports at the end. */
function observeStream(stream: AsyncIterable<unknown>, provider: Provider, report: (r: CallReport | null, error?: unknown) => void): void {
  const iterate = stream[Symbol.asyncIterator].bind(stream);
  Object.defineProperty(stream, Symbol.asyncIterator, {
    configurable: true,
    writable: true,
    value: (): AsyncIterator<unknown> => {
      const inner = iterate();
      const acc = provider.accumulator();
      let reported = false;
      const finish = (error?: unknown) => {
        if (reported) return;
        reported = true;
        report(safely(() => acc.report()) ?? null, error);
      };
      const iterator: AsyncIterableIterator<unknown> = {
        async next() {
          try {
            const step = await inner.next();
            if (step.done) finish();
            else safely(() => acc.add(step.value));
            return step;
          } catch (err) {
            finish(err);
            throw err;
          }
        },
        // A consumer that breaks out early still gets its partial call reported.
        async return(value?: unknown) {
          finish();
          return inner.return ? inner.return(value) : { done: true, value };
        },
        [Symbol.asyncIterator]() {
          return iterator;
        },
      };
      return iterator;
    },
  });
}

function reportCall(
  tracer: Tracer,
  provider: Provider,
  call: { params: Obj; parent: Span | undefined; ts: string; started: number },
  r: CallReport | null,
  error?: unknown,
): void {
  const requestModel = str(call.params.model);
  const model = r?.model || requestModel;
  const spanId = newSpanId();
  const traceId = call.parent?.trace_id ?? spanId;
  const inputTokens = r?.inputTokens ?? 0;
  const outputTokens = r?.outputTokens ?? 0;
  const metadata: Record<string, string> = {
    'gen_ai.system': provider.system,
    'gen_ai.operation.name': 'chat',
    'gen_ai.request.model': requestModel,
    'gen_ai.response.model': model,
    'gen_ai.usage.input_tokens': String(inputTokens),
    'gen_ai.usage.output_tokens': String(outputTokens),
  };
  tracer.emit({
    event_type: 'llm_call',
    tool: `${provider.system}.create`,
    phase: 'complete',
    ts: call.ts,
    span_id: spanId,
    trace_id: traceId,
    ...(call.parent && { parent_span_id: call.parent.span_id }),
    duration_ms: performance.now() - call.started,
    status: error === undefined ? 'ok' : 'error',
    input: toField(call.params.messages),
    output: error === undefined ? toField(r?.text) : toField(error instanceof Error ? error.message : error),
    cost: {
      model,
      input_tokens: inputTokens,
      output_tokens: outputTokens,
      cache_read_tokens: r?.cacheReadTokens ?? 0,
      reasoning_tokens: r?.reasoningTokens ?? 0,
      estimated_usd: r ? estimateUsd(model, { uncachedInput: r.uncachedInputTokens, cacheRead: r.cacheReadTokens, output: r.outputTokens }) : 0,
    },
    metadata,
  });
  for (const tool of r?.toolCalls ?? []) {
    tracer.emit({
      event_type: 'tool_use',
      tool: tool.name || 'unknown',
      phase: 'invoked',
      ts: call.ts,
      trace_id: traceId,
      parent_span_id: spanId,
      input: toField(tool.arguments),
      metadata: { 'gen_ai.system': provider.system },
    });
  }
}

function openaiUsage(model: string, usage: Obj, text: string, toolCalls: ToolCall[]): CallReport {
  const input = num(usage.prompt_tokens);
  const cached = Math.min(input, num(obj(usage.prompt_tokens_details).cached_tokens));
  return {
    model,
    inputTokens: input,
    uncachedInputTokens: input - cached,
    outputTokens: num(usage.completion_tokens),
    cacheReadTokens: cached,
    reasoningTokens: num(obj(usage.completion_tokens_details).reasoning_tokens),
    text,
    toolCalls,
  };
}

const OPENAI: Provider = {
  system: 'openai',
  fromResponse(response) {
    const r = obj(response);
    const message = obj(obj(list(r.choices)[0]).message);
    const toolCalls = list(message.tool_calls).map((c) => {
      const fn = obj(obj(c).function);
      return { name: str(fn.name), arguments: str(fn.arguments) };
    });
    return openaiUsage(str(r.model), obj(r.usage), str(message.content), toolCalls);
  },
  accumulator() {
    let model = '';
    let usage: Obj = {};
    let text = '';
    // Tool calls arrive in pieces keyed by index: the first piece names it, the rest append arguments.
    const calls = new Map<number, ToolCall>();
    return {
      add(item) {
        const chunk = obj(item);
        model ||= str(chunk.model);
        if (chunk.usage) usage = obj(chunk.usage);
        for (const choice of list(chunk.choices)) {
          const delta = obj(obj(choice).delta);
          text += str(delta.content);
          for (const piece of list(delta.tool_calls)) {
            const p = obj(piece);
            const fn = obj(p.function);
            const index = num(p.index);
            const call = calls.get(index) ?? { name: '', arguments: '' };
            call.name ||= str(fn.name);
            call.arguments += str(fn.arguments);
            calls.set(index, call);
          }
        }
      },
      report: () =>
        openaiUsage(
          model,
          usage,
          text,
          [...calls.entries()].sort((a, b) => a[0] - b[0]).map(([, c]) => c),
        ),
    };
  },
};

function anthropicUsage(model: string, usage: Obj, outputTokens: number, text: string, toolCalls: ToolCall[]): CallReport {
  // Anthropic's input_tokens already excludes cache reads and cache writes.
  const uncached = num(usage.input_tokens) + num(usage.cache_creation_input_tokens);
  const cacheRead = num(usage.cache_read_input_tokens);
  return {
    model,
    inputTokens: uncached + cacheRead,
    uncachedInputTokens: uncached,
    outputTokens,
    cacheReadTokens: cacheRead,
    reasoningTokens: 0,
    text,
    toolCalls,
  };
}

const ANTHROPIC: Provider = {
  system: 'anthropic',
  fromResponse(response) {
    const r = obj(response);
    const blocks = list(r.content).map(obj);
    const text = blocks
      .filter((b) => b.type === 'text')
      .map((b) => str(b.text))
      .join('');
    const toolCalls = blocks.filter((b) => b.type === 'tool_use').map((b) => ({ name: str(b.name), arguments: JSON.stringify(b.input ?? {}) }));
    const usage = obj(r.usage);
    return anthropicUsage(str(r.model), usage, num(usage.output_tokens), text, toolCalls);
  },
  accumulator() {
    let model = '';
    let usage: Obj = {};
    let outputTokens = 0;
    let text = '';
    const tools = new Map<number, ToolCall>();
    return {
      add(item) {
        const event = obj(item);
        const index = num(event.index);
        switch (event.type) {
          case 'message_start': {
            const message = obj(event.message);
            model = str(message.model);
            usage = obj(message.usage);
            outputTokens = num(usage.output_tokens);
            break;
          }
          case 'content_block_start': {
            const block = obj(event.content_block);
            if (block.type === 'tool_use') tools.set(index, { name: str(block.name), arguments: '' });
            break;
          }
          case 'content_block_delta': {
            const delta = obj(event.delta);
            if (delta.type === 'text_delta') text += str(delta.text);
            const tool = tools.get(index);
            if (delta.type === 'input_json_delta' && tool) tool.arguments += str(delta.partial_json);
            break;
          }
          case 'message_delta': {
            // message_delta's usage is cumulative; newer API versions repeat the input counts there.
            const delta = obj(event.usage);
            outputTokens = num(delta.output_tokens) || outputTokens;
            usage = { ...usage, ...Object.fromEntries(Object.entries(delta).filter(([, v]) => typeof v === 'number')) };
            break;
          }
        }
      },
      report() {
        const toolCalls = [...tools.entries()].sort((a, b) => a[0] - b[0]).map(([, c]) => ({ name: c.name, arguments: c.arguments || '{}' }));
        return anthropicUsage(model, usage, outputTokens, text, toolCalls);
      },
    };
  },
};
