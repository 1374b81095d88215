// How often a run should checkpoint (issue 41), beside its rework: the API's checkpointAdvice,
// its own query. Its sentence always (the advice, or why there is none: no checkpoints measured
// yet, not enough failures to estimate); the figures it has: its checkpoints, what each costs,
// how often it takes them, how often a run of its GPUs is interrupted where it runs, the
// Young-Daly interval and the GPU-hours a week it would save; and the interruptions by cause.
// Null figures are not measured or not estimable: their rows are left out.
import { Fragment } from "react";

import { secondsShown } from "../../durations";
import { gpuHours, plural } from "../../format";
import type { CheckpointAdviceQuery } from "../../generated/graphql";
import { useQuery } from "../../useQuery";

export type Advice = CheckpointAdviceQuery["checkpointAdvice"];

export const CHECKPOINT_ADVICE = /* GraphQL */ `query CheckpointAdvice($run: String!, $ws: String) {
  checkpointAdvice(run: $run, workspace: $ws) {
    run gpus checkpoints costSeconds intervalSeconds scope failures failuresByCause { cause count }
    gpuHours mtbfSeconds optimalIntervalSeconds gpuHoursSavedPerWeek sentence
  }
}`;

// The run page and the panel ask it with the same variables: one request, one cache entry.
export function useCheckpointAdvice(run: string, workspace: string, enabled = true) {
  return useQuery<CheckpointAdviceQuery>(CHECKPOINT_ADVICE, { run, ws: workspace }, enabled);
}

// Whether it advises an interval (the restart loop's line takes it only then).
export function hasFigures(advice: Advice | null | undefined): advice is Advice {
  return advice !== null && advice !== undefined && advice.optimalIntervalSeconds !== null;
}

export function CheckpointAdvicePanel({ run, workspace }: { run: string; workspace: string }) {
  const found = useCheckpointAdvice(run, workspace);
  // not an alert: the run page's own (its load, Run again's form) are the page's alerts
  if (found.error) {
    return (
      <section className="panel checkpointing" aria-label="How often to checkpoint" data-advice="error">
        <h3>How often to checkpoint</h3>
        <p className="error" data-figure="checkpoint-error">
          {found.error}
        </p>
      </section>
    );
  }
  const advice = found.data?.checkpointAdvice;
  return advice ? <CheckpointAdviceView advice={advice} /> : null;
}

export function CheckpointAdviceView({ advice }: { advice: Advice }) {
  const facts: { figure: string; label: string; value: string }[] = [];
  if (advice.checkpoints > 0) {
    facts.push({ figure: "checkpoints", label: "Checkpoints", value: advice.checkpoints.toLocaleString("en-US") });
  }
  const seconds = (figure: string, label: string, value: number | null) => {
    if (value !== null) facts.push({ figure, label, value: secondsShown(value) });
  };
  seconds("checkpoint-cost", "Each costs", advice.costSeconds);
  seconds("checkpoint-interval", "Every", advice.intervalSeconds);
  seconds("mtbf", "Interrupted every", advice.mtbfSeconds);
  seconds("young-daly", "Young-Daly interval", advice.optimalIntervalSeconds);
  if (advice.gpuHoursSavedPerWeek !== null) {
    facts.push({ figure: "saved-per-week", label: "GPU-hours saved a week", value: `${gpuHours(advice.gpuHoursSavedPerWeek, 1)} GPU-h` });
  }
  // the most frequent cause first
  const causes = [...advice.failuresByCause].sort((a, b) => b.count - a.count || a.cause.localeCompare(b.cause));
  return (
    <section className="panel checkpointing" aria-label="How often to checkpoint" data-advice={hasFigures(advice) ? "interval" : "none"}>
      <h3>How often to checkpoint</h3>
      <p className="sentence" data-figure="checkpoint-sentence">
        {advice.sentence}
      </p>
      {facts.length > 0 && (
        <dl className="facts" aria-label="Checkpoint figures">
          {facts.map((f) => (
            <Fragment key={f.figure}>
              <dt>{f.label}</dt>
              <dd data-figure={f.figure}>{f.value}</dd>
            </Fragment>
          ))}
        </dl>
      )}
      {advice.failures > 0 && (
        <p className="muted" data-figure="interruptions">
          {advice.failures.toLocaleString("en-US")} {plural(advice.failures, "interruption")} of runs on {advice.scope} over
          30 days, in {gpuHours(advice.gpuHours, 1)} GPU-hours held there:{" "}
          <span className="causes" aria-label="Interruptions by cause">
            {causes.map((c, i) => (
              <span key={c.cause} data-cause={c.cause}>
                {i > 0 && ", "}
                {c.count} {c.cause}
              </span>
            ))}
          </span>
        </p>
      )}
    </section>
  );
}
