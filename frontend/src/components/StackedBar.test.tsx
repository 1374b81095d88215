import { cleanup, fireEvent, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";

import { CATEGORIES, STYLE } from "../categories";
import type { Ledger } from "../ledger";
import { decimalsFor } from "../format";
import { SWEEP_7 } from "../testing/ledgers";
import { Summary } from "../pages/Goodput";
import { Legend } from "./Legend";
import { StackedBar } from "./StackedBar";

afterEach(cleanup);

describe("StackedBar", () => {
  it("draws a segment per category in its colour, to the page's scale", () => {
    const picked: string[] = [];
    const { container } = render(
      <StackedBar ledger={SWEEP_7} name="sweep-7" scale={2 * (146.5 + 18.0)} decimals={1} onSegment={(c) => picked.push(c)} />,
    );
    const fill = container.querySelector<HTMLElement>(".bar-fill")!;
    expect(fill.style.width).toBe("50%");
    const idle = screen.getByRole("button", { name: "sweep-7 Idle: 21.0 GPU-hours" });
    expect(idle.style.background).toBe(hexToRgb(STYLE.idle.colour));
    fireEvent.click(idle);
    expect(picked).toEqual(["idle"]);
    expect(container.querySelectorAll(".segment")).toHaveLength(5);
  });
});

describe("Summary", () => {
  it("shows goodput, held, productive, not productive with the biggest loss, and waiting", () => {
    const { container } = render(<Summary total={SWEEP_7} decimals={1} />);
    const figure = (name: string) => container.querySelector(`[data-figure="${name}"]`)?.textContent;
    expect(figure("goodput")).toBe("77%");
    expect(figure("held")).toBe("146.5 GPU-h");
    expect(figure("productive")).toBe("112.4 GPU-h");
    expect(figure("not-productive")).toBe("34.1 GPU-h biggest loss: Idle 21.0");
    expect(figure("waiting")).toBe("18.0 GPU-h");
  });
});

// issue 36: a run of a few GPU-minutes read "HELD 0.2 USED 0.0 GOODPUT 15%"; the CLI's test of the
// same run (tests/test_cli_goodput.py: productive 108, idle 576, starting 36, waiting 12 GPU-s)
// prints HELD 0.200 USED 0.030 IDLE 0.160 START 0.010 WAITING 0.003.
const SMALL: Ledger = {
  allocatedGpuHours: 720 / 3600,
  productiveGpuHours: 108 / 3600,
  lostGpuHours: 624 / 3600,
  waitingGpuHours: 12 / 3600,
  goodput: 0.15,
  gpuHours: [
    { category: "productive", gpuHours: 108 / 3600, heldGpuHours: 108 / 3600 },
    { category: "idle", gpuHours: 576 / 3600, heldGpuHours: 576 / 3600 },
    { category: "starting", gpuHours: 36 / 3600, heldGpuHours: 36 / 3600 },
  ],
  biggestLoss: { category: "idle", gpuHours: 576 / 3600, heldGpuHours: 576 / 3600 },
};

// Held parts in GPU-seconds whose rounded GPU-hours do not add up (3 × 0.0333… under 0.100).
const THIRDS: Ledger = {
  allocatedGpuHours: 360 / 3600,
  productiveGpuHours: 120 / 3600,
  lostGpuHours: 240 / 3600,
  waitingGpuHours: 0,
  goodput: 1 / 3,
  gpuHours: [
    { category: "productive", gpuHours: 120 / 3600, heldGpuHours: 120 / 3600 },
    { category: "idle", gpuHours: 120 / 3600, heldGpuHours: 120 / 3600 },
    { category: "failure", gpuHours: 120 / 3600, heldGpuHours: 120 / 3600 },
  ],
  biggestLoss: { category: "idle", gpuHours: 120 / 3600, heldGpuHours: 120 / 3600 },
};

function shown(ledger: Ledger): { summary: Record<string, string | null | undefined>; titles: (string | null)[] } {
  const decimals = decimalsFor([ledger.allocatedGpuHours]);
  const { container } = render(
    <>
      <Summary total={ledger} decimals={decimals} />
      <StackedBar ledger={ledger} name="tiny" scale={1} decimals={decimals} />
    </>,
  );
  const figure = (name: string) => container.querySelector(`[data-figure="${name}"]`)?.textContent;
  const summary = Object.fromEntries(["goodput", "held", "productive", "not-productive", "waiting"].map((f) => [f, figure(f)]));
  return { summary, titles: [...container.querySelectorAll(".segment")].map((s) => s.getAttribute("title")) };
}

describe("a small run's figures (issue 36)", () => {
  it("have the CLI's digits: not 0.0, and its used over held is its goodput", () => {
    expect(shown(SMALL)).toEqual({
      summary: {
        goodput: "15%",
        held: "0.200 GPU-h",
        productive: "0.030 GPU-h",
        "not-productive": "0.170 GPU-h biggest loss: Idle 0.160",
        waiting: "0.003 GPU-h",
      },
      titles: ["Productive: 0.030 GPU-hours", "Idle: 0.160 GPU-hours", "Starting: 0.010 GPU-hours", "Waiting: 0.003 GPU-hours"],
    });
  });

  it("add up as printed: the bar's segments make its held, not productive is held less used", () => {
    const { summary, titles } = shown(THIRDS);
    expect(summary.held).toBe("0.100 GPU-h");
    // 0.0333… each: one of the three is given the unit the others' rounding left over
    expect(titles).toEqual(["Productive: 0.034 GPU-hours", "Idle: 0.033 GPU-hours", "Failure: 0.033 GPU-hours"]);
    expect(summary["not-productive"]).toBe("0.066 GPU-h biggest loss: Idle 0.033");
  });
});

describe("Legend", () => {
  it("names every category once", () => {
    render(<Legend />);
    // in the bar's order, which src/categories.test.ts spells out
    expect(screen.getAllByRole("listitem").map((li) => li.textContent)).toEqual(
      CATEGORIES.map((c) => c.label),
    );
  });
});

function hexToRgb(hex: string): string {
  const n = parseInt(hex.slice(1), 16);
  return `rgb(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255})`;
}
