import pino from 'pino';

export type Logger = pino.Logger;

/**
 * Structured logs. Entity ids go in as fields (`tenant`, `sandbox_id`, `experiment_id`), never
 * in the message; the redact paths keep the known secret-bearing fields out of every line.
 */
export function createLogger(level: string, name = 'svc'): Logger {
  return pino({
    name,
    level,
    redact: {
      paths: ['req.headers.authorization', 'authorization', 'apiKey', 'api_key', 'key', 'secret', 'secrets', '*.secret', '*.secrets'],
      censor: '[REDACTED]',
    },
  });
}
