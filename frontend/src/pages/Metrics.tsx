// Metrics: CPU, memory, GPU utilisation, GPU memory, tensor cores, SM activity, memory
// bandwidth (seed L-36 … L-38) and network received, one uPlot chart each, a series per worker
// (or per GPU). A metric the workers' machines do not measure (their agent said so: network
// bytes where workers share the host's network) says why instead of showing nothing.
// The range is the run's or worker's life by default (start to end, or now), so a run a few
// seconds old shows a curve, not a dot; the Memory chart draws each worker's memory limit as a
// line, the one an OOM kill's "Memory chart" points to (seed L-52). A gap in a series' samples
// breaks its line (GAP_STEPS).
import { useEffect, useMemo, useRef, useState } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

import type { MetricRangeQuery } from "../generated/graphql";
import type { Life } from "../life";
import { useQuery } from "../useQuery";

// A series as the chart reads it: labels decoded from JSON, points as [time in ms, value].
interface Series {
  labels: Record<string, string>;
  points: [number, number][];
}

type Range = MetricRangeQuery["metricRange"];

function decoded(series: Range["series"]): Series[] {
  return series.map((s) => ({
    labels: (s.labels ?? {}) as Record<string, string>,
    points: s.points.map(([t, v]) => [t, v] as [number, number]),
  }));
}

// `rate`: a counter, charted as its rate per second. `bytes`: in MiB or GiB, as its largest
// value reads best. `limit`: the metric drawn over it as a dashed line (its limit).
export interface ChartSpec {
  metric: string;
  title: string;
  unit: string;
  rate?: boolean;
  limit?: string;
}

export const CHARTS: ChartSpec[] = [
  { metric: "task_cpu_usage_cores", title: "CPU", unit: "cores" },
  { metric: "task_memory_used_bytes", title: "Memory", unit: "bytes", limit: "task_memory_limit_bytes" },
  { metric: "task_gpu_utilization_ratio", title: "GPU utilisation", unit: "%" },
  { metric: "task_gpu_memory_used_bytes", title: "GPU memory", unit: "bytes" },
  { metric: "task_gpu_tensor_active_ratio", title: "Tensor cores", unit: "%" },
  { metric: "task_gpu_sm_active_ratio", title: "SM activity", unit: "%" },
  { metric: "task_gpu_dram_active_ratio", title: "Memory bandwidth", unit: "%" },
  { metric: "task_network_receive_bytes_total", title: "Network received", unit: "KiB/s", rate: true },
];

// The window charted, in Unix seconds: its life (a second either side, at least 10 s long so
// a life of a second is still a line), or the last `seconds`; `end` null is now.
export function windowOf(seconds: number | null, life: Life | undefined, now: number): { start: number; end: number | null } {
  if (seconds !== null || !life) return { start: Math.floor(now / 1000) - (seconds ?? 3600), end: null };
  const start = Math.floor(Date.parse(life.from) / 1000) - 1;
  if (life.to === null) return { start: Math.min(start, Math.floor(now / 1000) - 10), end: null };
  return { start, end: Math.max(Math.ceil(Date.parse(life.to) / 1000) + 1, start + 10) };
}

export const RANGES: { label: string; seconds: number }[] = [
  { label: "15 minutes", seconds: 900 },
  { label: "1 hour", seconds: 3600 },
  { label: "6 hours", seconds: 6 * 3600 },
  { label: "24 hours", seconds: 86_400 },
  { label: "7 days", seconds: 7 * 86_400 },
];

const COLOURS = ["#1c7ed6", "#e8590c", "#2f9e44", "#9c36b5", "#c2255c", "#0c8599", "#5c940d", "#862e9c"];

export const QUERY = /* GraphQL */ `query MetricRange($metric: String!, $match: [String!], $by: String, $start: String, $end: String, $rate: Boolean!) {
  metricRange(metric: $metric, match: $match, by: $by, agg: "avg", start: $start, end: $end, rate: $rate) {
    metric unit step series { labels points } unmeasured notMeasured
  }
}`;

function scaled(unit: string, value: number): number {
  if (unit === "GiB") return value / 2 ** 30;
  if (unit === "MiB") return value / 2 ** 20;
  if (unit === "KiB/s") return value / 1024;
  if (unit === "%") return value * 100;
  return value;
}

// Bytes in MiB below a GiB (12 MiB, not 0.01 GiB), as the console writes sizes (issue 21).
export function unitOf(unit: string, values: number[]): string {
  if (unit !== "bytes") return unit;
  return values.some((v) => v >= 2 ** 30) ? "GiB" : "MiB";
}

export interface Plot {
  unit: string;
  labels: string[];
  // Whether each series is a limit, drawn dashed.
  limits: boolean[];
  // uPlot's columns: null breaks a series' line (a gap in its samples); undefined is a time
  // only another series has, over which its line goes on.
  data: (number | null | undefined)[][];
}

// Samples further apart than this many steps (the answer's, or the series' own spacing where
// the machine samples less often than the step) have a gap between them: no samples came
// (the agent away, the worker not running), and a line across it would draw values never
// measured (issue 36).
export const GAP_STEPS = 3;

// The times (ms) at which a series' line breaks: one step after each sample followed by a gap.
export function gapsOf(points: [number, number][], stepMs: number): number[] {
  const spacings = points.slice(1).map(([t], i) => t - points[i][0]);
  if (spacings.length === 0) return [];
  const usual = [...spacings].sort((a, b) => a - b)[Math.floor(spacings.length / 2)];
  const gap = GAP_STEPS * Math.max(stepMs, usual);
  return points.slice(0, -1).flatMap(([t], i) => (spacings[i] > gap ? [t + Math.max(stepMs, 1)] : []));
}

// The chart's columns: the times (Unix seconds), then one column per series and per limit, in
// the chart's unit; a limit is labelled "limit of <its labels>". A series' gaps are nulls.
export function plotOf(metric: string, unit: string, series: Series[], limits: Series[], stepMs: number): Plot {
  const all = [...series, ...limits];
  const shown = unitOf(unit, all.flatMap((s) => s.points.map(([, v]) => v)));
  const gaps = all.map((s) => new Set(gapsOf(s.points, stepMs)));
  const sampled = all.flatMap((s) => s.points.map(([t]) => t));
  const times = [...new Set([...sampled, ...gaps.flatMap((g) => [...g])])].sort((a, b) => a - b);
  const label = (s: Series) => Object.values(s.labels).join(" / ") || metric;
  const columns = all.map((s, i) => {
    const at = new Map(s.points.map(([t, v]) => [t, scaled(shown, v)]));
    return times.map((t) => at.get(t) ?? (gaps[i].has(t) ? null : undefined));
  });
  return {
    unit: shown,
    labels: [...series.map(label), ...limits.map((s) => `limit of ${label(s)}`)],
    limits: all.map((_, i) => i >= series.length),
    data: [times.map((t) => t / 1000), ...columns],
  };
}

const LIFE = -1; // the Range option of its life

export function Metrics({ match, by, life }: { match: string[]; by: string; life?: Life }) {
  const [seconds, setSeconds] = useState(life ? LIFE : RANGES[1].seconds);
  // fixed when the range is picked, so the queries' variables stay the same between renders
  const span = useMemo(() => windowOf(seconds === LIFE ? null : seconds, life, Date.now()), [seconds, life?.from, life?.to]);
  return (
    <section aria-label="Metrics">
      <label className="range">
        Range{" "}
        <select aria-label="Range" value={seconds} onChange={(e) => setSeconds(Number(e.target.value))}>
          {life && <option value={LIFE}>{life.to ? "Its life" : "Its life so far"}</option>}
          {RANGES.map((r) => (
            <option key={r.seconds} value={r.seconds}>
              {r.label}
            </option>
          ))}
        </select>
      </label>
      <div className="charts">
        {CHARTS.map((c) => (
          <Chart key={c.metric} {...c} match={match} by={c.metric.startsWith("task_gpu") ? `${by},gpu` : by} start={span.start} end={span.end} />
        ))}
      </div>
    </section>
  );
}

function Chart(props: ChartSpec & { match: string[]; by: string; start: number; end: number | null }) {
  const { metric, title, unit, match, by, limit } = props;
  const rate = props.rate ?? false;
  const start = String(props.start);
  const end = props.end === null ? null : String(props.end);
  const found = useQuery<MetricRangeQuery>(QUERY, { metric, match, by, start, end, rate }, true, 10_000);
  const limits = useQuery<MetricRangeQuery>(
    QUERY,
    { metric: limit ?? metric, match, by, start, end, rate: false },
    limit !== undefined,
    10_000,
  );
  const box = useRef<HTMLDivElement>(null);
  const series = found.data?.metricRange.series;
  const limitSeries = limit ? limits.data?.metricRange.series : undefined;
  // drawn once its limit has answered too, so the chart is not drawn without it and again with it
  const limitSettled = limit === undefined || limits.data !== null || limits.error !== null;
  const step = found.data?.metricRange.step ?? 0;
  const plot = useMemo(
    () => plotOf(metric, unit, decoded(series ?? []), decoded(limitSeries ?? []), step),
    [metric, unit, series, limitSeries, step],
  );
  useEffect(() => {
    if (!box.current || !series || series.length === 0 || !limitSettled) return;
    const chart = new uPlot(
      {
        width: box.current.clientWidth || 560,
        height: 180,
        series: [
          {},
          ...plot.labels.map((label, i) => ({
            label,
            stroke: plot.limits[i] ? "#e03131" : COLOURS[i % COLOURS.length],
            width: 1.5,
            ...(plot.limits[i] ? { dash: [6, 4] } : {}),
          })),
        ],
        axes: [{}, { label: plot.unit, size: 50 }],
        // the whole range picked, however few the samples in it
        scales: {
          x: { time: true, range: [Number(start), end === null ? Date.now() / 1000 : Number(end)] },
          ...(unit === "%" ? { y: { range: [0, 100] } } : {}),
        },
      },
      plot.data as uPlot.AlignedData,
      box.current,
    );
    return () => chart.destroy();
  }, [plot, series, limitSettled, unit, start, end]);
  const empty = found.data && found.data.metricRange.series.length === 0;
  const notMeasured = found.data?.metricRange.notMeasured ?? null;
  return (
    <figure className="chart" aria-label={title} data-metric={metric}>
      <figcaption>
        {title} <span className="muted">({series?.length ? plot.unit : unitOf(unit, [])})</span>
      </figcaption>
      {found.error && <p className="error">{found.error}</p>}
      {notMeasured && (
        <p className="empty not-measured" title={found.data?.metricRange.unmeasured.join(", ")}>
          {notMeasured}
        </p>
      )}
      {empty && !notMeasured && <p className="empty">No samples in this range{metric.includes("_gpu_") && metric !== "task_gpu_utilization_ratio" ? " (this figure is measured on Hopper GPUs with NVML)" : ""}.</p>}
      <div ref={box} />
    </figure>
  );
}
