// A run and its workers as the run and worker pages read them: the result types generated from
// schema.graphql and the documents (npm run codegen), the WorkerFields fragment, and the JSON
// fields (its specification, a worker's failure snapshot) decoded.
import type { RunQuery, WorkerFieldsFragment } from "../../generated/graphql";

export type Worker = WorkerFieldsFragment;
export type Run = NonNullable<RunQuery["run"]>;
export type RestartLoop = NonNullable<Run["restartLoop"]>;
export type HistoryEntry = Run["history"][number];

// The failure snapshot (JSON in the schema) as the agent writes it.
export interface LastFailure {
  reason?: string;
  failed_at?: string;
  exit_code?: number | null;
  log_tail?: string | null;
}

export function lastFailureOf(worker: { lastFailure: unknown } | null | undefined): LastFailure | null {
  const found = worker?.lastFailure;
  return found && typeof found === "object" ? (found as LastFailure) : null;
}

// The stored specification (JSON in the schema): its keys as the run specification names them.
export function specOf(run: { spec: unknown }): Record<string, unknown> {
  return run.spec && typeof run.spec === "object" ? (run.spec as Record<string, unknown>) : {};
}

// A document that spreads ...WorkerFields appends this once.
export const WORKER_FIELDS = /* GraphQL */ `
  fragment WorkerFields on Worker {
    name rank state reason stateSince gpus gpuIds restarts restartAt exitCode lastFailure
    machine lastPlacement { machine gpuIds } straggler advice { reason exitCode kind lookAt open }
  }`;
