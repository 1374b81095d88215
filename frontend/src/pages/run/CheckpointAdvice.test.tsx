// Issue 41: how often a run should checkpoint, on its page under its rework, as the API's
// checkpointAdvice answers it: its sentence always; the figures it has (null ones left out);
// the interruptions by cause; and the sentence as a line of the Restarting in a loop panel
// when it advises an interval.
import { cleanup, render, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { renderWithData } from "../../testing/render";
import { aRun, aWorker } from "../../testing/runs";
import { CheckpointAdvicePanel, type Advice } from "./CheckpointAdvice";
import { Panels } from "./Panels";

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

const ADVISED: Advice = {
  run: "llama-sft",
  gpus: 2,
  checkpoints: 40,
  costSeconds: 20,
  intervalSeconds: 120,
  scope: "pool h100",
  failures: 4,
  failuresByCause: [
    { cause: "lost", count: 1 },
    { cause: "signalled", count: 3 },
  ],
  gpuHours: 133.33,
  mtbfSeconds: 60_000,
  optimalIntervalSeconds: 1549.2,
  gpuHoursSavedPerWeek: 31.24,
  sentence:
    "Checkpoint every 26 min, not every 2 min (each checkpoint costs 20 s, and a run of 2 GPUs on pool h100 is interrupted every 16 h 40 min on average): about 31.2 GPU-hours saved a week of running",
};

const NOT_ENOUGH: Advice = {
  ...ADVISED,
  checkpoints: 12,
  failures: 2,
  failuresByCause: [{ cause: "signalled", count: 2 }],
  gpuHours: 1.3,
  mtbfSeconds: null,
  optimalIntervalSeconds: null,
  gpuHoursSavedPerWeek: null,
  sentence: "Not enough failures to estimate: 2 in 1.3 GPU-hours on pool h100 over 30 days (3 needed)",
};

const NOT_MEASURED: Advice = {
  ...NOT_ENOUGH,
  checkpoints: 0,
  costSeconds: null,
  intervalSeconds: null,
  failures: 0,
  failuresByCause: [],
  gpuHours: 0,
  sentence:
    "No checkpoints measured yet: its workload reports checkpoint_step in its progress file at each checkpoint, a step at a time (two at least)",
};

function answering(advice: Advice) {
  const asked: Record<string, unknown>[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (_url: string, init: RequestInit) => {
      const { query, variables } = JSON.parse(String(init.body)) as { query: string; variables: Record<string, unknown> };
      expect(query).toContain("checkpointAdvice(run: $run, workspace: $ws)");
      asked.push(variables);
      return new Response(JSON.stringify({ data: { checkpointAdvice: advice } }), { status: 200 });
    }),
  );
  return asked;
}

async function shown(advice: Advice) {
  const asked = answering(advice);
  renderWithData(<CheckpointAdvicePanel run="llama-sft" workspace="ml" />);
  const panel = await screen.findByRole("region", { name: "How often to checkpoint" });
  expect(asked).toEqual([{ run: "llama-sft", ws: "ml" }]);
  const facts = Array.from(panel.querySelectorAll("dl dt")).map((dt) => [
    dt.textContent,
    dt.nextElementSibling?.textContent,
    dt.nextElementSibling?.getAttribute("data-figure"),
  ]);
  return { panel, facts };
}

describe("how often to checkpoint (issue 41)", () => {
  it("gives the advice and its figures, and the interruptions by cause", async () => {
    const { panel, facts } = await shown(ADVISED);
    expect(within(panel).getByRole("heading").textContent).toBe("How often to checkpoint");
    expect(panel.getAttribute("data-advice")).toBe("interval");
    expect(panel.querySelector('[data-figure="checkpoint-sentence"]')?.textContent).toBe(ADVISED.sentence);
    expect(facts).toEqual([
      ["Checkpoints", "40", "checkpoints"],
      ["Each costs", "20 s", "checkpoint-cost"],
      ["Every", "2 min", "checkpoint-interval"],
      ["Interrupted every", "16 h 40 min", "mtbf"],
      ["Young-Daly interval", "26 min", "young-daly"],
      ["GPU-hours saved a week", "31.2 GPU-h", "saved-per-week"],
    ]);
    expect(panel.querySelector('[data-figure="interruptions"]')?.textContent).toBe(
      "4 interruptions of runs on pool h100 over 30 days, in 133.3 GPU-hours held there: 3 signalled, 1 lost",
    );
    expect(panel.querySelector('[data-cause="signalled"]')?.textContent).toBe("3 signalled");
  });

  it("says there are not enough failures, with what it measured and no estimate", async () => {
    const { panel, facts } = await shown(NOT_ENOUGH);
    expect(panel.getAttribute("data-advice")).toBe("none");
    expect(panel.querySelector('[data-figure="checkpoint-sentence"]')?.textContent).toBe(
      "Not enough failures to estimate: 2 in 1.3 GPU-hours on pool h100 over 30 days (3 needed)",
    );
    expect(facts).toEqual([
      ["Checkpoints", "12", "checkpoints"],
      ["Each costs", "20 s", "checkpoint-cost"],
      ["Every", "2 min", "checkpoint-interval"],
    ]);
    for (const f of ["mtbf", "young-daly", "saved-per-week"]) expect(panel.querySelector(`[data-figure="${f}"]`)).toBeNull();
    expect(panel.querySelector('[data-figure="interruptions"]')?.textContent).toBe(
      "2 interruptions of runs on pool h100 over 30 days, in 1.3 GPU-hours held there: 2 signalled",
    );
  });

  it("gives only its sentence before any checkpoint is measured", async () => {
    const { panel, facts } = await shown(NOT_MEASURED);
    expect(panel.querySelector('[data-figure="checkpoint-sentence"]')?.textContent).toBe(NOT_MEASURED.sentence);
    expect(facts).toEqual([]);
    expect(panel.querySelector("dl")).toBeNull();
    expect(panel.querySelector('[data-figure="interruptions"]')).toBeNull();
  });
});

describe("an advice the API cannot give", () => {
  it("says its error in the panel, not as one more alert of the run page", async () => {
    vi.stubGlobal(
      "fetch",
      vi.fn(async () => new Response(JSON.stringify({ data: null, errors: [{ message: "No run named gone" }] }), { status: 200 })),
    );
    renderWithData(<CheckpointAdvicePanel run="gone" workspace="ml" />);
    const panel = await screen.findByRole("region", { name: "How often to checkpoint" });
    expect(panel.getAttribute("data-advice")).toBe("error");
    expect(panel.querySelector('[data-figure="checkpoint-error"]')?.textContent).toContain("No run named gone");
    expect(screen.queryByRole("alert")).toBeNull();
  });
});

describe("the restart loop's advice (issue 41)", () => {
  const none = () => undefined;
  const looping = () =>
    aRun({
      state: "Pending",
      reason: "Restarting in 40s (3/10): Worker llama-sft-0 failed on gpu-07: Exited with code 1",
      restartLoop: {
        restarts: 3,
        maxRestarts: 10,
        restartAt: "2026-10-01T01:10:40Z",
        worker: aWorker({ restarts: 3, lastFailure: { reason: "Exited with code 1", failed_at: "2026-10-01T01:10:00Z" } }),
      },
    });

  it("adds the checkpoint advice's sentence when it advises an interval", () => {
    render(<Panels run={looping()} checkpoint={ADVISED} onLog={none} onMetrics={none} />);
    const panel = screen.getByRole("region", { name: "Restarting in a loop" });
    const line = panel.querySelector('[data-figure="loop-checkpoint"]');
    expect(line?.textContent).toBe(ADVISED.sentence);
    expect(line?.parentElement?.textContent).toBe(`How often to checkpoint: ${ADVISED.sentence}`);
  });

  it("adds nothing without figures or without the advice", () => {
    render(<Panels run={looping()} checkpoint={NOT_ENOUGH} onLog={none} onMetrics={none} />);
    expect(screen.getByRole("region", { name: "Restarting in a loop" }).querySelector('[data-figure="loop-checkpoint"]')).toBeNull();
    cleanup();
    render(<Panels run={looping()} onLog={none} onMetrics={none} />);
    expect(screen.getByRole("region", { name: "Restarting in a loop" }).querySelector('[data-figure="loop-checkpoint"]')).toBeNull();
  });
});
