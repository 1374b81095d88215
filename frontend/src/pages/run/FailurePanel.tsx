// Why it failed (seed: Debug a failed run): the run's reason turned into advice, its failed
// worker's last failure, Its log, the Memory chart or Metrics, the last lines it wrote.
import { when } from "../../format";
import { visible } from "../../logs/lines";
import { lastFailureOf, type Run, type Worker } from "./model";

export function FailurePanel({
  run,
  worker,
  onLog,
  onMemory,
}: {
  run: Run;
  worker: Worker | null;
  onLog: (worker: string) => void;
  onMemory: () => void;
}) {
  // The run's own advice (its time limit, its retry budget, …), else its failed worker's.
  const advice = run.advice ?? worker?.advice ?? null;
  const failure = lastFailureOf(worker);
  const tail = failure?.log_tail;
  return (
    <section className="panel failure" aria-label="Why it failed">
      <h2>Why it failed</h2>
      <p className="sentence">{run.reason}</p>
      {advice && (
        <p>
          <strong>Look at:</strong> <span data-figure="advice">{advice.lookAt}</span>
        </p>
      )}
      {worker && failure?.reason && failure.reason !== run.reason && (
        <p data-figure="last-failure">
          Its last failure: {worker.name}: {failure.reason}
          {failure.failed_at ? ` at ${when(failure.failed_at)}` : ""}.
        </p>
      )}
      <div className="actions">
        {worker && (
          <button type="button" onClick={() => onLog(worker.name)}>
            Its log
          </button>
        )}
        {(advice?.open === "memory" || advice?.open === "metrics") && (
          <button type="button" onClick={onMemory}>
            {advice.open === "memory" ? "Memory chart" : "Metrics"}
          </button>
        )}
      </div>
      {tail && (
        <details>
          <summary>The last lines it wrote before it failed</summary>
          <pre className="log">{visible(tail)}</pre>
        </details>
      )}
    </section>
  );
}

