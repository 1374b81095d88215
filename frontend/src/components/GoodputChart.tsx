// Goodput over time (issue 23): a stacked area of where the GPU time went, hour by hour (or
// day by day), in the categories' colours, with the goodput ratio as a line on its own scale.
// A click on an hour opens the worker intervals behind it. Drawn with uPlot, as the metrics.
import { useEffect, useRef } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

import { STYLE } from "../categories";
import { gpuHours } from "../format";
import type { GoodputScope, GoodputSeriesQuery, GoodputStep } from "../generated/graphql";
import { pointAt, stackOf, type SeriesPoint } from "../series";
import { useQuery } from "../useQuery";

export const SERIES = /* GraphQL */ `query GoodputSeries($by: GoodputScope!, $name: String, $start: DateTime, $step: GoodputStep!, $ws: String) {
  goodputSeries(by: $by, name: $name, start: $start, step: $step, workspace: $ws) {
    start end step
    points { start end ledger { allocatedGpuHours waitingGpuHours goodput gpuHours { category heldGpuHours } } }
  }
}`;

export interface ChartProps {
  by: GoodputScope;
  name: string | null;
  workspace: string;
  start: string;
  step?: GoodputStep;
  title: string;
  onPoint: (point: SeriesPoint) => void;
}

export function GoodputChart({ by, name, workspace, start, step = "HOUR", title, onPoint }: ChartProps) {
  const found = useQuery<GoodputSeriesQuery>(SERIES, { by, name, start, step, ws: workspace });
  const box = useRef<HTMLDivElement>(null);
  const series = found.data?.goodputSeries;
  // the latest handler, without drawing the chart again when it changes
  const picked = useRef(onPoint);
  picked.current = onPoint;
  useEffect(() => {
    if (!box.current || !series || series.points.length === 0) return;
    const points = series.points;
    const stack = stackOf(points);
    // each step drawn to its end: the last point's value repeated at the series' end
    const times = [...stack.times, Date.parse(series.end) / 1000];
    const hold = <T,>(values: T[]) => [...values, values[values.length - 1]];
    const stepped = uPlot.paths.stepped!({ align: 1 });
    // the top category first: each fill is painted over by those below it
    const tops = [...stack.tops].reverse();
    const chart = new uPlot(
      {
        width: box.current.clientWidth || 720,
        height: 220,
        series: [
          {},
          ...tops.map(({ category }) => ({
            label: STYLE[category].label,
            stroke: STYLE[category].colour,
            fill: STYLE[category].colour,
            width: 0,
            paths: stepped,
            scale: "gpuh",
            value: (_: uPlot, v: number | null) => (v === null ? "—" : gpuHours(v)),
          })),
          {
            label: "Goodput",
            stroke: "#212529",
            width: 2,
            paths: stepped,
            scale: "%",
            value: (_: uPlot, v: number | null) => (v === null ? "—" : `${Math.round(v)}%`),
          },
        ],
        scales: {
          x: { time: true, range: [times[0], times[times.length - 1]] },
          gpuh: { range: (_u, _min, max) => [0, Math.max(max, 1)] },
          "%": { range: [0, 100] },
        },
        axes: [
          {},
          { scale: "gpuh", label: "GPU-hours", size: 50 },
          { scale: "%", side: 1, label: "Goodput", size: 50, grid: { show: false }, values: (_u, ticks) => ticks.map((t) => `${t}%`) },
        ],
        legend: { show: false },
      },
      [times, ...tops.map((t) => hold(t.values)), hold(stack.goodput)] as uPlot.AlignedData,
      box.current,
    );
    const click = () => {
      if (chart.cursor.left === undefined || chart.cursor.left < 0) return;
      const point = pointAt(points, chart.posToVal(chart.cursor.left, "x"));
      if (point) picked.current(point);
    };
    chart.over.addEventListener("click", click);
    return () => {
      chart.over.removeEventListener("click", click);
      chart.destroy();
    };
  }, [series]);
  const empty = series && series.points.every((p) => p.ledger.allocatedGpuHours + p.ledger.waitingGpuHours === 0);
  return (
    <figure className="chart goodput-chart" aria-label={title} data-points={series?.points.length ?? 0}>
      <figcaption>
        {title} <span className="muted">(GPU-hours each {step === "DAY" ? "day" : "hour"}; the line: goodput. Click an {step === "DAY" ? "day" : "hour"} for its intervals.)</span>
      </figcaption>
      {found.error && <p className="error">{found.error}</p>}
      {found.loading && !series && <p className="muted">Loading…</p>}
      {empty && <p className="empty">No GPU time in this period.</p>}
      <div ref={box} />
    </figure>
  );
}
