export { createClient, SvcError } from './client.ts';
export type { AgentMetadata, AgentSnapshot, ClientOptions, CommandResult, Comparison, CreateSandbox, Experiment, Page, PageQuery, Sandbox, SpecRecord, StoredTraceEvent, SvcClient, TraceFilters } from './client.ts';
export { getTracer, traced, Tracer } from './tracing.ts';
export type { EventInput, EventType, Phase, Span, TraceCost, TraceEventBody, TracerOptions } from './tracing.ts';
export { wrapAnthropic, wrapOpenAI } from './wrappers.ts';
export type { AnthropicLike, OpenAILike, WrapOptions } from './wrappers.ts';
export { estimateUsd, PRICES, priceOf } from './prices.ts';
export type { ModelPrice } from './prices.ts';
