/**
 * An experiment over a dataset (docs/datasets.md): the request's `dataset`, else the spec's,
 * resolved to one version of one dataset of the tenant and pinned in the experiment's options
 * (with the spec version and the agent snapshot, it names exactly what each scenario ran), and its
 * scenarios (each selected record times each matrix entry, record-major) written to
 * svc.experiment-scenarios before the experiment itself, so the aggregator can plan its runs and
 * RunResults can list them before any has run.
 */
import { DATASET_SCENARIOS_MAX, datasetScenarios, scenarioCount, scenarioRecordOf } from '../../domain/datasets.ts';
import type { ExperimentDataset, ExperimentScenario } from '../../domain/events/experiment-events.ts';
import { type Params, recordReferences } from '../../domain/params.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import { publish, type Kernel, type OutgoingEvent } from '../../kernel/actor.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { eventIds } from '../../kernel/ids.ts';
import type { RecordPosition } from '../../kernel/log/event-log.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { DatasetCatalog } from '../catalogs/dataset-catalog.ts';
import { allRecords, countRecords, type RecordSelection } from '../datasets/record-reads.ts';
import type { DatasetRequest } from './create-request.ts';

/** Bytes of scenarios per append, well under the log's largest record batch. */
const APPEND_BYTES = 4 * 1024 * 1024;

const selectionOf = (tenant: string, pin: ExperimentDataset, last: number): RecordSelection => ({
  tenant,
  datasetId: pin.id,
  version: pin.version,
  last,
  tags: pin.tags ?? null,
  ids: pin.record_ids ?? null,
});

/**
 * The dataset an experiment of `doc` runs, resolved and counted: undefined when neither the
 * request nor the spec names one (a 400 if the spec refers to a record all the same). A dataset
 * of another tenant's id is a 403; an unknown one, or a name the tenant has no dataset of, a 404.
 */
export async function pinDataset(
  kernel: Kernel,
  datasets: DatasetCatalog,
  tenant: string,
  requested: DatasetRequest | null,
  doc: SpecDocument,
  matrix: Params[],
): Promise<ExperimentDataset | undefined> {
  const wanted = requested ?? doc.dataset;
  if (wanted === null) {
    const at = recordReferences(doc.raw);
    if (at.length > 0)
      throw badRequest(
        'dataset',
        `spec "${doc.id}" refers to a dataset record ({{ input }} or {{ expected }} at ${at.slice(0, 3).join(', ')}) but neither it nor the request names a dataset`,
      );
    return undefined;
  }
  const field = requested ? 'dataset' : `spec "${doc.id}": dataset`;
  const dataset = wanted.id !== undefined ? datasets.ofTenant(tenant, wanted.id) : datasets.named(tenant, wanted.name!);
  if (!dataset) throw new AppError('not_found', `${field}: no dataset named ${JSON.stringify(wanted.name)} exists`);
  const version = wanted.version ?? dataset.version;
  if (version > dataset.version)
    throw badRequest(`${field}.version`, `dataset ${dataset.dataset_id} has no version ${version} (its newest is ${dataset.version})`);
  const pin: ExperimentDataset = {
    id: dataset.dataset_id,
    name: dataset.name,
    version,
    ...(wanted.tags && { tags: wanted.tags }),
    ...(requested?.record_ids && { record_ids: requested.record_ids }),
    records: 0,
  };
  pin.records = await countRecords(kernel.store, selectionOf(tenant, pin, dataset.versions[version - 1].records));
  const which = `version ${version} of dataset ${dataset.dataset_id} (${dataset.name})${pin.tags ? ` with any of the tags ${pin.tags.join(', ')}` : ''}${pin.record_ids ? ' among the record_ids' : ''}`;
  if (pin.records === 0) throw badRequest(field, `${which} has no records: nothing to run`);
  const scenarios = scenarioCount(matrix.length, pin);
  if (scenarios > DATASET_SCENARIOS_MAX)
    throw badRequest(
      field,
      `${which} has ${pin.records} records, times ${matrix.length} matrix entries that is ${scenarios} scenarios, over the limit of ${DATASET_SCENARIOS_MAX}; select fewer with tags`,
    );
  return pin;
}

/**
 * Writes the scenarios of an experiment over `pin`, page by page of records, and waits until the
 * scenarios table holds them. With an idempotent request's `seed` the events' ids derive from it,
 * so a retried creation writes the same scenarios again, which every reader keeps once.
 */
export async function publishScenarios(
  kernel: Kernel,
  datasets: DatasetCatalog,
  tenant: string,
  experimentId: string,
  pin: ExperimentDataset,
  matrix: Params[],
  seed: string | null,
): Promise<void> {
  const dataset = datasets.ofTenant(tenant, pin.id);
  const ids = eventIds(seed);
  const count = scenarioCount(matrix.length, pin);
  const positions: RecordPosition[] = [];
  let seen = 0;
  for await (const records of allRecords(kernel.store, selectionOf(tenant, pin, dataset.versions[pin.version - 1].records))) {
    const scenarios = datasetScenarios(
      records.map((r) => scenarioRecordOf(pin.id, r)),
      matrix,
      seen,
    );
    seen += records.length;
    let batch: OutgoingEvent[] = [];
    let bytes = 0;
    for (const { index, params } of scenarios) {
      const json = JSON.stringify(params);
      const value: ExperimentScenario = {
        tenant,
        event_id: ids(`scenario ${index}`),
        ts: Date.now(),
        experiment_id: experimentId,
        scenario_index: index,
        scenario_count: count,
        params: json,
      };
      if (bytes + json.length > APPEND_BYTES && batch.length > 0) {
        positions.push(...(await publish(kernel, TOPICS.experimentScenarios, batch)));
        [batch, bytes] = [[], 0];
      }
      batch.push({ key: experimentId, tenant, value });
      bytes += json.length + 200;
    }
    if (batch.length > 0) positions.push(...(await publish(kernel, TOPICS.experimentScenarios, batch)));
  }
  // Records are immutable: only a deletion meanwhile changes what the count saw.
  if (seen !== pin.records)
    throw new AppError('conflict', `dataset ${pin.id} changed while the experiment was created (${seen} records instead of ${pin.records}); create it again`);
  await kernel.visibility.waitFor(positions, kernel.config.replyTimeout);
}
