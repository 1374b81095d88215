import { cleanup, render, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";

import { aRun, aWorker } from "../../testing/runs";
import { Panels } from "./Panels";

afterEach(cleanup);

const none = () => undefined;

function panels(run: ReturnType<typeof aRun>): string[] {
  render(<Panels run={run} onLog={none} onMetrics={none} />);
  return screen.queryAllByRole("region").map((r) => r.getAttribute("aria-label") ?? "");
}

const PREEMPTED = "Preempted by higher-priority work (llm)";
const FAILED_ONCE = {
  reason: "Exited with code 1",
  failed_at: "2026-10-01T01:10:00Z",
  exit_code: 1,
  log_tail: "Traceback …\nRuntimeError: boom\n",
};
const PROGRAM = { reason: "Exited with code 1", exitCode: 1, kind: "program" as const, lookAt: "Your program: its log.", open: "log" };

describe("a preempted run (seed L-57)", () => {
  it("shows the Preempted panel alone, even with failures in a row before it (issue 36)", () => {
    // the API gives its restart loop from a failure minutes before it was preempted
    const loop = { restarts: 1, maxRestarts: 10, restartAt: null, worker: aWorker({ lastFailure: FAILED_ONCE }) };
    const run = aRun({
      state: "Pending",
      reason: PREEMPTED,
      advice: { reason: PREEMPTED, exitCode: null, kind: "preempted", lookAt: "Not a failure: it is queued again.", open: "log" },
      restartLoop: loop,
    });
    expect(panels(run)).toEqual(["Why it was stopped"]);
    const panel = screen.getByRole("region", { name: "Why it was stopped" });
    expect(within(panel).getByRole("heading").textContent).toBe("Preempted");
    expect(panel.querySelector('[data-figure="advice"]')?.textContent).toBe("Not a failure: it is queued again.");
  });
});

describe("a run restarting after failures (seed L-68, L-69)", () => {
  const restarting = (maxRestarts: number) =>
    aRun({
      state: "Pending",
      reason: "Restarting in 40s (3/5): Worker llama-sft-0 failed on gpu-07: Exited with code 1",
      advice: { ...PROGRAM, reason: "Worker llama-sft-0 failed on gpu-07: Exited with code 1" },
      restartLoop: {
        restarts: 3,
        maxRestarts,
        restartAt: "2026-10-01T01:10:40Z",
        worker: aWorker({ lastFailure: FAILED_ONCE, advice: PROGRAM, restarts: 3 }),
      },
      waitAdvice: { reason: "Restarting in 40s (3/5): …", exitCode: null, kind: "restart_loop", lookAt: "The console's Restarting in a loop panel …", open: "restarts" },
    });

  it("shows the loop panel alone, its counts and its rule from the API's restartLoop", () => {
    expect(panels(restarting(5))).toEqual(["Restarting in a loop"]);
    const panel = screen.getByRole("region", { name: "Restarting in a loop" });
    expect(panel.querySelector('[data-figure="restarts"]')?.textContent).toBe("3 of 5");
    expect(panel.querySelector('[data-figure="loop-rule"]')?.textContent).toBe(
      "Each failure doubles the wait, up to 5 minutes; after 5 restarts in a row it gives up; 10 minutes running resets the count.",
    );
    expect(panel.querySelector('[data-figure="loop-reason"]')?.textContent).toBe("Exited with code 1");
    expect(panel.querySelector("pre.log")?.textContent).toBe(FAILED_ONCE.log_tail);
  });

  it("says its own max_restarts, not a fixed 10 (issue 36)", () => {
    panels(restarting(1));
    expect(document.querySelector('[data-figure="loop-rule"]')?.textContent).toContain("after 1 restart in a row it gives up");
  });
});

describe("an image run that does not start", () => {
  it("says why, with each machine's reason, where no machine runs containers (issue 36)", () => {
    const reason =
      "No machine runs containers: this cluster's agents run processes; drop image or add a machine with --executor docker";
    const run = aRun({
      state: "Pending",
      reason,
      workers: [aWorker({ state: "Pending", reason, machine: null, gpuIds: [], lastPlacement: null })],
      pendingReasons: [{ machine: "local", reason: "runs processes, not containers: the run names an image" }],
      waitAdvice: { reason, exitCode: null, kind: "machines", lookAt: "The per-machine reasons: Read a pending reason.", open: "machines" },
    });
    expect(panels(run)).toEqual(["Why it waits"]);
    const panel = screen.getByRole("region", { name: "Why it waits" });
    expect(within(panel).getByRole("heading").textContent).toBe("Why it does not start");
    expect(panel.querySelector(".sentence")?.textContent).toBe(reason);
    expect(within(panel).getByRole("list", { name: "Per machine" }).textContent).toBe(
      "local: runs processes, not containers: the run names an image",
    );
  });

  it("says a pull is slow while it pulls (seed L-66)", () => {
    const reason = "Pulling image nvcr.io/nvidia/pytorch:24.01-py3: 1.2 GiB of 8.4 GiB";
    const run = aRun({
      state: "Pulling",
      reason,
      waitAdvice: { reason, exitCode: null, kind: "pulling", lookAt: "A large image on a slow link. Later runs on that machine reuse it.", open: "log" },
    });
    expect(panels(run)).toEqual(["Why it waits"]);
    expect(document.querySelector('[data-figure="wait-advice"]')?.textContent).toBe(
      "A large image on a slow link. Later runs on that machine reuse it.",
    );
  });

  it("shows an image that cannot be pulled in the loop panel, with the seed's advice (seed L-53)", () => {
    const pull = { reason: "ErrImagePull: manifest unknown", failed_at: "2026-10-01T01:10:00Z", exit_code: null, log_tail: null };
    const advice = { reason: pull.reason, exitCode: null, kind: "image_pull" as const, lookAt: "Image name and tag; for a private registry, the registry credential.", open: "log" };
    const run = aRun({
      state: "Pending",
      reason: "Restarting in 20s (1/10): Worker llama-sft-0 failed on gpu-07: ErrImagePull: manifest unknown",
      advice,
      restartLoop: { restarts: 1, maxRestarts: 10, restartAt: "2026-10-01T01:10:20Z", worker: aWorker({ lastFailure: pull, advice }) },
      waitAdvice: { reason: "…", exitCode: null, kind: "restart_loop", lookAt: "…", open: "restarts" },
    });
    expect(panels(run)).toEqual(["Restarting in a loop"]);
    expect(document.querySelector('[data-figure="loop-advice"]')?.textContent).toBe(advice.lookAt);
  });
});

describe("a failure's last lines (issue 37 N7)", () => {
  it("shows the workload's control characters by markers, as the Logs tab does", () => {
    const hostile = { ...FAILED_ONCE, log_tail: "\x1b[2J\x1b]0;pwned\x07gone\rall good\ninvoice\u202efdp.exe\n" };
    const loop = { restarts: 1, maxRestarts: 10, restartAt: null, worker: aWorker({ lastFailure: hostile, advice: PROGRAM }) };
    const run = aRun({ state: "Pending", reason: "Restarting in 40s (1/10): …", restartLoop: loop });
    render(<Panels run={run} onLog={none} onMetrics={none} />);
    const panel = screen.getByRole("region", { name: "Restarting in a loop" });
    expect(panel.querySelector("pre.log")?.textContent).toBe("␛[2J␛]0;pwned␇gone␍all good\ninvoice<U+202E>fdp.exe\n");
  });
});
