// Issue 23: a run's rework on its page, as GraphQL's Run.rework answers it: the GPU-hours of
// steps done again (a part of productive), each restart's checkpoint, reached step and steps
// redone; "unknown", not 0, without checkpoint reports; nothing for a run that never restarted.
import { cleanup, render, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";

import { Rework } from "./Rework";

afterEach(cleanup);

const REDO = {
  attempt: 2,
  restartedAt: "2026-10-01T02:28:50Z",
  checkpointStep: 400,
  reachedStep: 500,
  stepsRedone: 100,
  until: "2026-10-01T02:45:40Z",
  caughtUp: true,
  gpuHours: 4000 / 3600,
};

describe("a run's rework", () => {
  it("gives the GPU-hours redone, their share of productive and each restart", () => {
    render(<Rework rework={{ gpuHours: 4000 / 3600, redos: [REDO] }} productive={11.11} decimals={1} />);
    const figure = document.querySelector('[data-figure="rework"]')!;
    expect(figure.textContent).toBe("Rework 1.1 GPU-hours (10% of productive)");
    const table = screen.getByRole("table", { name: "Restarts and the steps they redid" });
    const cells = within(table).getAllByRole("cell").map((c) => c.textContent);
    expect(cells).toEqual(["2026-10-01 02:28:50 UTC", "400", "500", "100", "2026-10-01 02:45:40 UTC", "1.1"]);
  });

  it("takes its run's digits (issue 36: a small run's rework was 0.0)", () => {
    render(<Rework rework={{ gpuHours: 36 / 3600, redos: [{ ...REDO, gpuHours: 36 / 3600 }] }} productive={0.2} decimals={3} />);
    expect(document.querySelector('[data-figure="rework"]')!.textContent).toBe("Rework 0.010 GPU-hours (5% of productive)");
    expect(within(screen.getByRole("table")).getAllByRole("cell").at(-1)?.textContent).toBe("0.010");
  });

  it("says unknown, not 0, without checkpoint reports", () => {
    const redo = { ...REDO, checkpointStep: null, stepsRedone: null, gpuHours: null, caughtUp: false, until: null };
    render(<Rework rework={{ gpuHours: null, redos: [redo] }} productive={11.11} decimals={1} />);
    expect(document.querySelector('[data-figure="rework"]')!.textContent).toMatch(/^Rework unknown — it restarted without reporting checkpoints/);
    const cells = within(screen.getByRole("table")).getAllByRole("cell").map((c) => c.textContent);
    expect(cells.slice(1)).toEqual(["unknown", "500", "unknown", "still redoing", "unknown"]);
  });

  it("shows nothing for a run that never restarted", () => {
    const { container } = render(<Rework rework={{ gpuHours: 0, redos: [] }} productive={3} decimals={1} />);
    expect(container.textContent).toBe("");
  });
});
