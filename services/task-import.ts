/**
 * `svc import TASK_DIR`: a benchmark task written for containers, as specs this service runs
 * unchanged (docs/benchmarks.md).
 *
 * - Terminal-Bench: `task.yaml` (instruction, max_agent_timeout_sec, max_test_timeout_sec),
 *   `Dockerfile` (its context the task folder), `run-tests.sh` and `tests/`, `solution.sh`.
 * - Harbor: `task.toml` ([agent] and [verifier] timeout_sec), `instruction.md`,
 *   `environment/Dockerfile` (its context `environment/`), `tests/` (`test.sh`), `solution/solve.sh`.
 *
 * The task's image is built from its Dockerfile into the local image store (the runner's, in
 * SVC_DATA_DIR) as `imported/<name>:1`; the spec runs it as root inside with a writable root, the
 * agent starting in the image's WORKDIR, the instruction as the prompt, and the task's tests as
 * grader-only files (under `/workspace/.grader`, there only while the checks run) that one
 * `command_exit` check runs, in the WORKDIR, with `TEST_DIR` pointing at them. Two specs are
 * written: `<name>.yaml` without an agent (give it yours), and `<name>.solution.yaml` whose agent
 * is the task's reference solution, the import's own check (it should pass; the first, with no
 * agent, should fail).
 */
import fs from 'node:fs';
import path from 'node:path';
import { parse as parseToml } from 'smol-toml';
import { parse as parseYaml, stringify } from 'yaml';
import { buildCommand } from './sandbox-runner/images/image-builder.ts';
import { ImageStore, type PullSettings } from './sandbox-runner/images/images.ts';

/** What a task folder says, whatever its layout. */
interface TaskFolder {
  name: string;
  instruction: string;
  dockerfile: string;
  context: string;
  /** grader file path (under .grader/) -> file on disk */
  tests: Map<string, string>;
  /** the test entry point, relative to .grader/ */
  testScript: string;
  solution: string | null;
  agentTimeoutS: number;
  testTimeoutS: number;
}

const GRADER_DIR = '.grader';

/** Reads a Terminal-Bench or Harbor task folder; throws naming what is missing. */
export function readTaskFolder(dir: string, name = path.basename(path.resolve(dir))): TaskFolder {
  const at = (...parts: string[]) => path.join(dir, ...parts);
  const specName =
    name
      .toLowerCase()
      .replace(/[^a-z0-9-]+/g, '-')
      .replace(/^-+|-+$/g, '')
      .slice(0, 60) || 'task';
  if (fs.existsSync(at('task.yaml'))) {
    const task = parseYaml(fs.readFileSync(at('task.yaml'), 'utf8')) as Record<string, unknown>;
    const instruction =
      typeof task.instruction === 'string' ? task.instruction : (task.descriptions as Array<{ description?: string }> | undefined)?.[0]?.description;
    if (!instruction) throw new Error(`${at('task.yaml')} has no instruction`);
    const tests = new Map([['run-tests.sh', need(at('run-tests.sh'))], ...filesUnder(at('tests'), 'tests')]);
    return {
      name: specName,
      instruction,
      dockerfile: need(at('Dockerfile')),
      context: dir,
      tests,
      testScript: 'run-tests.sh',
      solution: readIf(at('solution.sh')),
      agentTimeoutS: Number(task.max_agent_timeout_sec) || 360,
      testTimeoutS: Number(task.max_test_timeout_sec) || 60,
    };
  }
  if (fs.existsSync(at('task.toml'))) {
    const task = parseToml(fs.readFileSync(at('task.toml'), 'utf8')) as { agent?: { timeout_sec?: number }; verifier?: { timeout_sec?: number } };
    need(at('tests', 'test.sh'));
    return {
      name: specName,
      instruction: fs.readFileSync(need(at('instruction.md')), 'utf8'),
      dockerfile: need(at('environment', 'Dockerfile')),
      context: at('environment'),
      tests: new Map(filesUnder(at('tests'), 'tests')),
      testScript: 'tests/test.sh',
      solution: readIf(at('solution', 'solve.sh')),
      agentTimeoutS: Number(task.agent?.timeout_sec) || 600,
      testTimeoutS: Number(task.verifier?.timeout_sec) || 600,
    };
  }
  throw new Error(`${dir} is neither a Terminal-Bench task (task.yaml) nor a Harbor task (task.toml)`);
}

function need(file: string): string {
  if (!fs.existsSync(file)) throw new Error(`the task has no ${file}`);
  return file;
}

function readIf(file: string): string | null {
  return fs.existsSync(file) ? fs.readFileSync(file, 'utf8') : null;
}

/** Every regular file under `dir` (links are not followed), as [`prefix/relative`, path]. */
function filesUnder(dir: string, prefix: string): Array<[string, string]> {
  if (!fs.existsSync(dir)) return [];
  return (fs.readdirSync(dir, { recursive: true, withFileTypes: true }) as fs.Dirent[])
    .filter((entry) => entry.isFile())
    .map((entry) => {
      const file = path.join(entry.parentPath, entry.name);
      return [`${prefix}/${path.relative(dir, file).split(path.sep).join('/')}`, file] as [string, string];
    })
    .sort(([a], [b]) => a.localeCompare(b));
}

/** The two specs of a task whose image is `base` with working directory `workdir`. */
export function taskSpecs(task: TaskFolder, base: string, workdir: string): { spec: object; solution: object | null } {
  const grader = `/workspace/${GRADER_DIR}`;
  const files = [...task.tests].map(([rel, file]) => {
    const bytes = fs.readFileSync(file);
    const text = bytes.toString('utf8');
    const binary = !Buffer.from(text, 'utf8').equals(bytes);
    return {
      path: `${GRADER_DIR}/${rel}`,
      content: binary ? bytes.toString('base64') : text,
      ...(binary ? { encoding: 'base64' } : {}),
      mode: (fs.statSync(file).mode & 0o111) !== 0 ? '0755' : '0644',
    };
  });
  // The tests' own shell: bash when the image has it (most tasks' scripts need it), else sh.
  const run = `cd ${workdir} && export TEST_DIR=${grader}/tests && if command -v bash >/dev/null 2>&1; then bash ${grader}/${task.testScript}; else sh ${grader}/${task.testScript}; fi`;
  const spec = {
    version: 1,
    id: task.name,
    base,
    task: { prompt: task.instruction },
    sandbox: { user: 'root' },
    grader: { files },
    invariants: { tests: { check: { type: 'command_exit', command: run, timeout: `${task.testTimeoutS}s` } } },
  };
  const solution =
    task.solution === null
      ? null
      : { ...spec, id: `${task.name}-solution`, agent: { type: 'cli', command: task.solution, workdir, timeout: `${task.agentTimeoutS}s` } };
  return { spec, solution };
}

/** `svc import TASK_DIR [--name NAME] [--out DIR]`: builds the image, writes the specs; 0 when done. */
export async function importCommand(
  dir: string,
  options: { name?: string; out?: string },
  dataDir: string,
  settings: PullSettings,
  out: (line: string) => void,
): Promise<number> {
  const task = readTaskFolder(dir, options.name);
  const image = `imported/${task.name}:1`;
  const built = await buildCommand(image, task.dockerfile, task.context, dataDir, settings, out);
  if (built !== 0) return built;
  const info = await new ImageStore(path.join(dataDir, 'images')).getImage(image);
  const { spec, solution } = taskSpecs(task, image, info?.config?.workdir || '/workspace');
  const outDir = options.out ?? '.';
  fs.mkdirSync(outDir, { recursive: true });
  const written = [[`${task.name}.yaml`, spec], ...(solution ? [[`${task.name}.solution.yaml`, solution]] : [])] as Array<[string, object]>;
  for (const [file, doc] of written) {
    fs.writeFileSync(path.join(outDir, file), stringify(doc, { lineWidth: 0 }));
    out(`wrote ${path.join(outDir, file)}`);
  }
  return 0;
}
