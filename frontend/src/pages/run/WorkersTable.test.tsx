import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";

import { aRun, aWorker } from "../../testing/runs";
import { WorkersTable } from "./WorkersTable";

afterEach(cleanup);

// seed L-26: State, What it means, Machine, GPUs, Exit code and restarts
function row(name: string): Record<string, string> {
  const tr = screen.getByRole("table", { name: "Workers" }).querySelector(`tr[data-row="${name}"]`)!;
  const figure = (f: string) => tr.querySelector(`[data-figure="${f}"]`)?.textContent ?? "";
  return { machine: figure("machine"), gpus: figure("gpus") };
}

describe("the Workers tab's Machine and GPUs (issue 36)", () => {
  it("says the GPU ids a placed worker holds, and how many one not placed asks for, marked", () => {
    const run = aRun({
      workers: [
        aWorker({ name: "sweep-0", gpuIds: [2, 3] }),
        aWorker({ name: "sweep-1", state: "Pending", reason: "Restarting in 20s", machine: null, gpuIds: [], lastPlacement: { machine: "gpu-08", gpuIds: [0, 1] } }),
        aWorker({ name: "sweep-2", gpus: 0, gpuIds: [] }),
      ],
    });
    render(<WorkersTable org="default" workspace="default" run={run} onLog={() => undefined} />);
    expect(row("sweep-0")).toEqual({ machine: "gpu-07", gpus: "2, 3" });
    // waiting to be placed again: it holds nothing now; "2" would read as GPU 2
    expect(row("sweep-1")).toEqual({ machine: "—", gpus: "2 asked" });
    expect(row("sweep-2")).toEqual({ machine: "gpu-07", gpus: "none" });
  });

  it("keeps an ended worker's machine and GPU ids: where it ran last", () => {
    const run = aRun({
      state: "Failed",
      workers: [
        aWorker({ name: "broken-0", state: "Failed", reason: "Exited with code 1", exitCode: 1, machine: null, gpuIds: [], lastPlacement: { machine: "gpu-08", gpuIds: [1] } }),
        aWorker({ name: "broken-1", state: "Stopped", reason: "Stopped before it started", machine: null, gpuIds: [], lastPlacement: null }),
      ],
    });
    render(<WorkersTable org="default" workspace="default" run={run} onLog={() => undefined} />);
    expect(row("broken-0")).toEqual({ machine: "gpu-08", gpus: "1" });
    expect(row("broken-1")).toEqual({ machine: "—", gpus: "2 asked" });
  });
});
