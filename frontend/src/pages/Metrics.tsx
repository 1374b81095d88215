// Metrics: CPU, memory, GPU utilisation, GPU memory, tensor cores, SM activity, memory
// bandwidth (seed L-36 … L-38) and network received, one uPlot chart each, a series per worker
// (or per GPU). A metric the workers' machines do not measure (their agent said so: network
// bytes where workers share the host's network) says why instead of showing nothing.
import { useEffect, useMemo, useRef, useState } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";

import { useQuery } from "../useQuery";

interface Series {
  labels: Record<string, string>;
  points: [number, number][];
}

interface Range {
  metric: string;
  unit: string;
  series: Series[];
  // The workers whose machine does not measure it, and why ("Not measured: …"); null: measured.
  unmeasured: string[];
  notMeasured: string | null;
}

// `rate`: a counter, charted as its rate per second.
export const CHARTS: { metric: string; title: string; unit: string; rate?: boolean }[] = [
  { metric: "task_cpu_usage_cores", title: "CPU", unit: "cores" },
  { metric: "task_memory_used_bytes", title: "Memory", unit: "GiB" },
  { metric: "task_gpu_utilization_ratio", title: "GPU utilisation", unit: "%" },
  { metric: "task_gpu_memory_used_bytes", title: "GPU memory", unit: "GiB" },
  { metric: "task_gpu_tensor_active_ratio", title: "Tensor cores", unit: "%" },
  { metric: "task_gpu_sm_active_ratio", title: "SM activity", unit: "%" },
  { metric: "task_gpu_dram_active_ratio", title: "Memory bandwidth", unit: "%" },
  { metric: "task_network_receive_bytes_total", title: "Network received", unit: "KiB/s", rate: true },
];

export const RANGES: { label: string; seconds: number }[] = [
  { label: "15 minutes", seconds: 900 },
  { label: "1 hour", seconds: 3600 },
  { label: "6 hours", seconds: 6 * 3600 },
  { label: "24 hours", seconds: 86_400 },
  { label: "7 days", seconds: 7 * 86_400 },
];

const COLOURS = ["#1c7ed6", "#e8590c", "#2f9e44", "#9c36b5", "#c2255c", "#0c8599", "#5c940d", "#862e9c"];

export const QUERY = `query($metric: String!, $match: [String!], $by: String, $start: String, $rate: Boolean!) {
  metricRange(metric: $metric, match: $match, by: $by, agg: "avg", start: $start, rate: $rate) {
    metric unit series { labels points } unmeasured notMeasured
  }
}`;

function scaled(unit: string, value: number): number {
  if (unit === "GiB") return value / 2 ** 30;
  if (unit === "KiB/s") return value / 1024;
  if (unit === "%") return value * 100;
  return value;
}

export function Metrics({ match, by }: { match: string[]; by: string }) {
  const [range, setRange] = useState(RANGES[1]);
  return (
    <section aria-label="Metrics">
      <label className="range">
        Range{" "}
        <select
          aria-label="Range"
          value={range.seconds}
          onChange={(e) => setRange(RANGES.find((r) => r.seconds === Number(e.target.value)) ?? RANGES[1])}
        >
          {RANGES.map((r) => (
            <option key={r.seconds} value={r.seconds}>
              {r.label}
            </option>
          ))}
        </select>
      </label>
      <div className="charts">
        {CHARTS.map((c) => (
          <Chart key={c.metric} {...c} match={match} by={c.metric.startsWith("task_gpu") ? `${by},gpu` : by} seconds={range.seconds} />
        ))}
      </div>
    </section>
  );
}

function Chart(props: {
  metric: string;
  title: string;
  unit: string;
  rate?: boolean;
  match: string[];
  by: string;
  seconds: number;
}) {
  const { metric, title, unit, match, by, seconds } = props;
  const rate = props.rate ?? false;
  // fixed when the range is picked, so the query's variables stay the same between renders
  const start = useMemo(() => String(Math.floor(Date.now() / 1000) - seconds), [seconds]);
  const found = useQuery<{ metricRange: Range }>(QUERY, { metric, match, by, start, rate }, true, 10_000);
  const box = useRef<HTMLDivElement>(null);
  useEffect(() => {
    const series = found.data?.metricRange.series ?? [];
    if (!box.current || series.length === 0) return;
    const times = [...new Set(series.flatMap((s) => s.points.map(([t]) => t)))].sort((a, b) => a - b);
    const columns = series.map((s) => {
      const at = new Map(s.points.map(([t, v]) => [t, scaled(unit, v)]));
      return times.map((t) => at.get(t) ?? null);
    });
    const plot = new uPlot(
      {
        width: box.current.clientWidth || 560,
        height: 180,
        series: [
          {},
          ...series.map((s, i) => ({
            label: Object.values(s.labels).join(" / ") || metric,
            stroke: COLOURS[i % COLOURS.length],
            width: 1.5,
          })),
        ],
        axes: [{}, { label: unit, size: 50 }],
        // the whole range picked, however few the samples in it
        scales: {
          x: { time: true, range: [Number(start), Date.now() / 1000] },
          ...(unit === "%" ? { y: { range: [0, 100] } } : {}),
        },
      },
      [times.map((t) => t / 1000), ...columns] as uPlot.AlignedData,
      box.current,
    );
    return () => plot.destroy();
  }, [found.data, unit, metric, start]);
  const empty = found.data && found.data.metricRange.series.length === 0;
  const notMeasured = found.data?.metricRange.notMeasured ?? null;
  return (
    <figure className="chart" aria-label={title} data-metric={metric}>
      <figcaption>
        {title} <span className="muted">({unit})</span>
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
