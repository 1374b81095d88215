import { plural, when } from "../../format";
import { visible } from "../../logs/lines";
import { hasFigures, type Advice } from "./CheckpointAdvice";
import { lastFailureOf, type RestartLoop } from "./model";

// A run restarting after failures or stalls in a row (seed: Restarting in a loop): its restarts,
// when the next attempt is, and the last failure's advice and output. How many restarts in a
// row it makes before it gives up is its own max_restarts (the seed's 10 is the default). Each
// restart redoes the steps since its last checkpoint: where the checkpoint advice (issue 41)
// gives an interval, its sentence is one more line of the advice.
export function RestartLoopPanel({
  loop,
  checkpoint = null,
  onLog,
  onMetrics,
}: {
  loop: RestartLoop;
  checkpoint?: Advice | null;
  onLog: (worker: string) => void;
  onMetrics: () => void;
}) {
  const w = loop.worker;
  const failure = lastFailureOf(w);
  return (
    <section className="panel restarting" aria-label="Restarting in a loop">
      <h2>Restarting in a loop</h2>
      <p>
        <span data-figure="restarts">
          {loop.restarts} of {loop.maxRestarts}
        </span>{" "}
        restarts in a row;{" "}
        {loop.restartAt ? <>next attempt at {when(loop.restartAt)}</> : <>started again</>}.
      </p>
      <p className="muted" data-figure="loop-rule">
        Each failure doubles the wait, up to 5 minutes; after {loop.maxRestarts} {plural(loop.maxRestarts, "restart")} in
        a row it gives up; 10 minutes running resets the count.
      </p>
      {hasFigures(checkpoint) && (
        <p>
          <strong>How often to checkpoint:</strong> <span data-figure="loop-checkpoint">{checkpoint.sentence}</span>
        </p>
      )}
      {w && failure && (
        <div>
          <p>
            The last failure: <strong>{w.name}</strong>: <span data-figure="loop-reason">{failure.reason}</span>
            {failure.failed_at ? ` at ${when(failure.failed_at)}` : ""}.
          </p>
          {w.advice && (
            <p>
              <strong>Look at:</strong> <span data-figure="loop-advice">{w.advice.lookAt}</span>
            </p>
          )}
          <div className="actions">
            <button type="button" onClick={() => onLog(w.name)}>
              Its log
            </button>
            {w.advice?.open === "metrics" && (
              <button type="button" onClick={onMetrics}>
                Metrics
              </button>
            )}
          </div>
          {failure.log_tail && <pre className="log">{visible(failure.log_tail)}</pre>}
        </div>
      )}
    </section>
  );
}

