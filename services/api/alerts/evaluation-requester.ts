/**
 * POST /v1/alerts/:id/evaluate asks the alerter, which owns the history and the dedup state, to
 * evaluate a rule on a completed experiment now: a request on svc.alert-evaluations, its reply
 * on svc.alert-replies (kernel/request-reply.ts). No alerter running: a 504 that says so.
 */
import type { Kernel } from '../../kernel/actor.ts';
import { AppError, ERROR_CODES, type ErrorCode } from '../../kernel/errors.ts';
import { newEventId } from '../../kernel/ids.ts';
import { Requester, type Exchange } from '../../kernel/request-reply.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { EvaluationAnswer } from '../../domain/alerts.ts';
import type { AlertChanged, AlertEvaluationReplied, AlertEvaluationRequested } from '../../domain/events/alert-events.ts';

const EXCHANGE: Exchange<AlertEvaluationReplied> = {
  requests: TOPICS.alertEvaluations,
  replies: TOPICS.alertReplies,
  correlationOf: (reply) => reply.correlation_id,
};

export class AlertEvaluator {
  private readonly requester: Requester<AlertEvaluationRequested, AlertEvaluationReplied>;

  constructor(kernel: Kernel) {
    this.requester = new Requester(kernel, EXCHANGE);
  }

  start(): Promise<void> {
    return this.requester.start();
  }

  stop(): Promise<void> {
    return this.requester.stop();
  }

  /** The alerter's evaluation of `rule` on `experimentId`; its errors as the AppErrors they were. */
  async evaluate(rule: AlertChanged, experimentId: string, dryRun: boolean, seed: string | null): Promise<EvaluationAnswer> {
    const reply = await this.requester.request(
      { key: rule.alert_id, tenant: rule.tenant, unanswered: 'the alerter did not evaluate the rule (is an alerter running?)' },
      (correlationId) => ({
        tenant: rule.tenant,
        event_id: newEventId(),
        ts: Date.now(),
        correlation_id: correlationId,
        alert_id: rule.alert_id,
        experiment_id: experimentId,
        dry_run: dryRun,
        seed: seed ?? correlationId,
      }),
    );
    if (reply.error !== null || reply.answer === null) {
      const [code, ...message] = (reply.error ?? 'internal: no answer').split(': ');
      throw new AppError(Object.hasOwn(ERROR_CODES, code!) ? (code as ErrorCode) : 'internal', message.join(': '));
    }
    return JSON.parse(reply.answer) as EvaluationAnswer;
  }
}
