import { describe, expect, it } from "vitest";

import { CATEGORIES } from "./categories";
import { pointAt, stackOf, type SeriesPoint } from "./series";

function point(start: string, end: string, held: Record<string, number>, waiting: number): SeriesPoint {
  const allocated = Object.values(held).reduce((a, b) => a + b, 0);
  return {
    start,
    end,
    ledger: {
      allocatedGpuHours: allocated,
      waitingGpuHours: waiting,
      goodput: allocated > 0 ? (held.productive ?? 0) / allocated : null,
      gpuHours: CATEGORIES.map(({ category }) => ({ category, heldGpuHours: held[category] ?? 0 })),
    },
  };
}

const POINTS = [
  point("2026-10-01T10:00:00Z", "2026-10-01T11:00:00Z", { productive: 6, idle: 1, failure: 1 }, 4),
  point("2026-10-01T11:00:00Z", "2026-10-01T12:00:00Z", {}, 0),
];

describe("a goodput series stacked", () => {
  it("puts each category on those before it, in the bar's order, waiting on top", () => {
    const stack = stackOf(POINTS);
    expect(stack.tops.map((t) => t.category)).toEqual(CATEGORIES.map((c) => c.category));
    const top = Object.fromEntries(stack.tops.map((t) => [t.category, t.values[0]]));
    expect(top.productive).toBe(6);
    expect(top.idle).toBe(7);
    expect(top.failure).toBe(8);
    expect(top.waiting).toBe(12); // held 8 and waiting 4: all the time asked for
    expect(stack.tops.at(-1)!.values[1]).toBe(0);
    expect(stack.goodput).toEqual([75, null]); // nothing held: no ratio, not 0
    expect(stack.times).toEqual([Date.parse("2026-10-01T10:00:00Z") / 1000, Date.parse("2026-10-01T11:00:00Z") / 1000]);
  });

  it("finds the point a time falls in", () => {
    expect(pointAt(POINTS, Date.parse("2026-10-01T11:59:59Z") / 1000)).toBe(POINTS[1]);
    expect(pointAt(POINTS, Date.parse("2026-10-01T12:00:00Z") / 1000)).toBeNull();
  });
});
