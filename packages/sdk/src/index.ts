export { createClient, SvcError } from './client.ts';
export type {
  AgentMetadata,
  AgentSnapshot,
  AuditRecord,
  ClientOptions,
  CommandResult,
  ComparedSide,
  Comparison,
  CreateExperiment,
  CreateSandbox,
  Dataset,
  Experiment,
  InvariantResult,
  Page,
  PageQuery,
  RunResult,
  RunResults,
  Sandbox,
  ScenarioResult,
  SpanRecord,
  SpecRecord,
  StoredTraceEvent,
  SvcClient,
  TaskBundle,
  TraceFilters,
} from './client.ts';
export { sandboxEvents, sseMessages } from './events.ts';
export type { SandboxEvent } from './events.ts';
export { getTracer, mergeVisibilityTokens, traced, Tracer } from './tracing.ts';
export type { EventInput, EventType, Phase, Span, TraceCost, TraceEventBody, TracerOptions } from './tracing.ts';
export { wrapAnthropic, wrapOpenAI } from './wrappers.ts';
export type { AnthropicLike, OpenAILike, WrapOptions } from './wrappers.ts';
export { estimateUsd, PRICES, priceOf } from './prices.ts';
export type { ModelPrice } from './prices.ts';
