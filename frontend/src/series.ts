// Goodput over time (issue 23): a series' points as the chart draws them. Each category's
// GPU-hours stacked in the bar's order (productive at the bottom, waiting on top), and the
// goodput ratio as a line of its own scale.
import { CATEGORIES } from "./categories";
import type { GoodputCategory } from "./generated/graphql";

export interface SeriesPoint {
  start: string;
  end: string;
  ledger: {
    allocatedGpuHours: number;
    waitingGpuHours: number;
    goodput: number | null;
    gpuHours: { category: GoodputCategory; heldGpuHours: number }[];
  };
}

export interface Stack {
  // Unix seconds of each point's start, then one column per category (its top edge: the
  // categories below it and itself, in GPU-hours), then goodput in % (null: nothing held).
  times: number[];
  tops: { category: GoodputCategory; values: number[] }[];
  goodput: (number | null)[];
}

// A category's part of a point, as the bar counts it: its held part; waiting is all not held.
function part(point: SeriesPoint, category: GoodputCategory): number {
  if (category === "waiting") return point.ledger.waitingGpuHours;
  return point.ledger.gpuHours.find((c) => c.category === category)?.heldGpuHours ?? 0;
}

export function stackOf(points: SeriesPoint[]): Stack {
  const running = points.map(() => 0);
  const tops = CATEGORIES.map(({ category }) => ({
    category,
    values: points.map((p, i) => (running[i] += part(p, category))),
  }));
  return {
    times: points.map((p) => Date.parse(p.start) / 1000),
    tops,
    goodput: points.map((p) => (p.ledger.goodput === null ? null : p.ledger.goodput * 100)),
  };
}

// The point a time falls in (Unix seconds), or null outside the series.
export function pointAt(points: SeriesPoint[], seconds: number): SeriesPoint | null {
  const ms = seconds * 1000;
  return points.find((p) => Date.parse(p.start) <= ms && ms < Date.parse(p.end)) ?? null;
}
