// The panels under a run's readout, one for what it is doing now (seed: Debug a failed run,
// Debug a run that does not start): Why it failed; Preempted ("Not a failure: it is queued
// again", seed L-57); Restarting in a loop (seed L-68), only for a run restarting after
// failures or stalls, never beside the Preempted panel (issue 36: both showed, with different
// counts); and Why it does not start, from the API's waitAdvice. The loop panel takes the run's
// checkpoint advice (issue 41) where the run page has it.
import { Sentences } from "../../components/Table";
import type { Advice } from "./CheckpointAdvice";
import { FailurePanel } from "./FailurePanel";
import type { Run } from "./model";
import { RestartLoopPanel } from "./RestartLoopPanel";

export interface PanelActions {
  onLog: (worker: string) => void;
  onMetrics: () => void;
}

export function Panels({
  run,
  checkpoint = null,
  onLog,
  onMetrics,
}: { run: Run; checkpoint?: Advice | null } & PanelActions) {
  const failed = run.state === "Failed";
  const preempted = !failed && run.advice?.kind === "preempted";
  // a preempted run waits to be placed again, not for a restart after a failure
  const loop = preempted ? null : run.restartLoop;
  const waits = run.waitAdvice && !(run.waitAdvice.kind === "restart_loop" && loop) ? run.waitAdvice : null;
  return (
    <>
      {failed && (run.failedWorker || run.advice) && (
        <FailurePanel run={run} worker={run.failedWorker} onLog={onLog} onMemory={onMetrics} />
      )}
      {preempted && run.advice && (
        <section className="panel preempted" aria-label="Why it was stopped">
          <h2>Preempted</h2>
          <p className="sentence">{run.reason}</p>
          <p>
            <strong>Look at:</strong> <span data-figure="advice">{run.advice.lookAt}</span>
          </p>
        </section>
      )}
      {loop && <RestartLoopPanel loop={loop} checkpoint={checkpoint} onLog={onLog} onMetrics={onMetrics} />}
      {waits && <WhyItWaits run={run} advice={waits} />}
    </>
  );
}

function WhyItWaits({ run, advice }: { run: Run; advice: NonNullable<Run["waitAdvice"]> }) {
  return (
    <section className="panel waiting" aria-label="Why it waits">
      <h2>Why it does not start</h2>
      <p className="sentence">{advice.reason}</p>
      <p>
        <strong>Look at:</strong> <span data-figure="wait-advice">{advice.lookAt}</span>
      </p>
      {advice.open === "machines" && run.pendingReasons.length > 0 && (
        <Sentences label="Per machine" items={run.pendingReasons.map((r) => ({ name: r.machine, sentence: r.reason }))} />
      )}
      {advice.open === "workers" && (
        <Sentences label="Its gang" items={run.workers.map((w) => ({ name: w.name, sentence: w.reason }))} />
      )}
    </section>
  );
}
