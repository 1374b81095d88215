// A run's rework (issue 23): the part of its productive time spent redoing the steps since its
// last checkpoint after each restart. "Unknown", not 0, when it restarted without reporting
// its checkpoints; nothing is shown for a run that never restarted.

import { gpuHours, when } from "../../format";
import type { RunQuery } from "../../generated/graphql";

type Run = NonNullable<RunQuery["run"]>;

// `decimals`: its run's (decimalsFor), as the CLI's rework line takes its table's.
export function Rework({ rework, productive, decimals }: { rework: Run["rework"]; productive: number; decimals: number }) {
  if (rework.redos.length === 0) return null;
  const share = rework.gpuHours !== null && productive > 0 ? ` (${Math.round((rework.gpuHours / productive) * 1000) / 10}% of productive)` : "";
  return (
    <div aria-label="Rework">
      <p className="muted" data-figure="rework" title="Productive GPU time spent redoing steps after restarts: from each restart until a worker reached the run's highest step again">
        Rework{" "}
        {rework.gpuHours === null ? (
          <strong>unknown</strong>
        ) : (
          <strong>{gpuHours(rework.gpuHours, decimals)} GPU-hours</strong>
        )}
        {share}
        {rework.gpuHours === null && <span> — it restarted without reporting checkpoints (astraeus_progress.report(step, checkpoint_step=…))</span>}
      </p>
      <table className="ledger" aria-label="Restarts and the steps they redid">
        <thead>
          <tr>
            <th>Restart</th>
            <th>Back to checkpoint</th>
            <th>Had reached</th>
            <th>Steps redone</th>
            <th>Caught up</th>
            <th>GPU-hours</th>
          </tr>
        </thead>
        <tbody>
          {rework.redos.map((r) => (
            <tr key={r.attempt} data-redo={r.attempt}>
              <td>{when(r.restartedAt)}</td>
              <td>{r.checkpointStep ?? "unknown"}</td>
              <td>{r.reachedStep ?? "unknown"}</td>
              <td>{r.stepsRedone ?? "unknown"}</td>
              <td>{r.caughtUp && r.until ? when(r.until) : r.until ? "restarted again" : "still redoing"}</td>
              <td>{r.gpuHours === null ? "unknown" : gpuHours(r.gpuHours, decimals)}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}
