// The goodput chart (uPlot) loads when a page first shows it, not with the console.
import { lazy, Suspense } from "react";

import type { ChartProps } from "./GoodputChart";

const Chart = lazy(() => import("./GoodputChart").then((m) => ({ default: m.GoodputChart })));

export function GoodputOverTime(props: ChartProps) {
  return (
    <Suspense fallback={<p className="muted">Loading the chart…</p>}>
      <Chart {...props} />
    </Suspense>
  );
}
