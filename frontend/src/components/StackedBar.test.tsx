import { cleanup, fireEvent, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it } from "vitest";

import { CATEGORIES, STYLE } from "../categories";
import type { Ledger } from "../ledger";
import { SWEEP_7 } from "../testing/ledgers";
import { Summary } from "../pages/Goodput";
import { Legend } from "./Legend";
import { StackedBar } from "./StackedBar";

afterEach(cleanup);

describe("StackedBar", () => {
  it("draws a segment per category in its colour, to the page's scale", () => {
    const picked: string[] = [];
    const { container } = render(
      <StackedBar ledger={SWEEP_7} name="sweep-7" scale={2 * (146.5 + 18.0)} onSegment={(c) => picked.push(c)} />,
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
    const { container } = render(<Summary total={SWEEP_7} />);
    const figure = (name: string) => container.querySelector(`[data-figure="${name}"]`)?.textContent;
    expect(figure("goodput")).toBe("77%");
    expect(figure("held")).toBe("146.5 GPU-h");
    expect(figure("productive")).toBe("112.4 GPU-h");
    expect(figure("not-productive")).toBe("34.1 GPU-h biggest loss: Idle 21.0");
    expect(figure("waiting")).toBe("18.0 GPU-h");
  });
});

// issue 36: a run of a few GPU-minutes read "HELD 0.2 USED 0.0 GOODPUT 15%"
const SMALL: Ledger = {
  allocatedGpuHours: 0.2,
  productiveGpuHours: 0.03,
  lostGpuHours: 0.17,
  waitingGpuHours: 0.0022,
  goodput: 0.15,
  gpuHours: [
    { category: "productive", gpuHours: 0.03, heldGpuHours: 0.03 },
    { category: "idle", gpuHours: 0.17, heldGpuHours: 0.17 },
  ],
  biggestLoss: { category: "idle", gpuHours: 0.17, heldGpuHours: 0.17 },
};

describe("a small run's figures", () => {
  it("are not 0.0, and the summary and its bar's segments say the same", () => {
    const { container } = render(
      <>
        <Summary total={SMALL} />
        <StackedBar ledger={SMALL} name="tiny" scale={0.2022} />
      </>,
    );
    const figure = (name: string) => container.querySelector(`[data-figure="${name}"]`)?.textContent;
    expect(figure("goodput")).toBe("15%");
    expect(figure("held")).toBe("0.20 GPU-h");
    expect(figure("productive")).toBe("0.030 GPU-h");
    expect(figure("not-productive")).toBe("0.17 GPU-h biggest loss: Idle 0.17");
    expect(figure("waiting")).toBe("0.0022 GPU-h");
    const titles = [...container.querySelectorAll(".segment")].map((s) => s.getAttribute("title"));
    expect(titles).toEqual([
      "Productive: 0.030 GPU-hours",
      "Idle: 0.17 GPU-hours",
      "Waiting: 0.0022 GPU-hours",
    ]);
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
