/**
 * The problems of a request body, each naming its field, gathered so that one 400 lists them
 * all (joined by "; ") instead of answering the first alone.
 */
import { AppError } from '../kernel/errors.ts';

/** Records one problem of a field: `<field>: <problem>`. */
export type Bad = (field: string, problem: string) => void;

export class FieldProblems {
  private readonly problems: string[] = [];

  readonly bad: Bad = (field, problem) => {
    this.problems.push(`${field}: ${problem}`);
  };

  /** The 400 listing every problem, when there is one. */
  throwIfAny(): void {
    if (this.problems.length > 0) throw new AppError('bad_request', this.problems.join('; '));
  }
}
