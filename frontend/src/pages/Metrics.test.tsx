import { cleanup, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { renderWithData } from "../testing/render";
import { CHARTS, gapsOf, Metrics, plotOf, windowOf } from "./Metrics";

// uPlot asks for the device's pixel ratio as it loads; jsdom has no matchMedia.
vi.hoisted(() => {
  window.matchMedia ??= ((query: string) =>
    ({ matches: false, media: query, addEventListener() {}, removeEventListener() {} }) as unknown as MediaQueryList);
});

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

const HOST_NETWORK = "Not measured: this machine's agent runs processes on the host's network";

// The server's answer (as tests/metrics/test_unmeasured.py has it answer): no samples of any
// metric in the range; network bytes not measured on the worker's machine.
function answering(notMeasured: Record<string, string>) {
  const asked: Record<string, unknown>[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (_url: string, init: RequestInit) => {
      const { variables } = JSON.parse(String(init.body)) as { variables: Record<string, unknown> };
      asked.push(variables);
      const metric = String(variables.metric);
      const body = {
        data: {
          metricRange: {
            metric,
            unit: "",
            step: 1000,
            series: [],
            unmeasured: metric in notMeasured ? ["llama-sft-0"] : [],
            notMeasured: notMeasured[metric] ?? null,
          },
        },
      };
      return new Response(JSON.stringify(body), { status: 200 });
    }),
  );
  return asked;
}

describe("Metrics", () => {
  it("says a metric is not measured instead of showing nothing, and charts network received", async () => {
    const asked = answering({ task_network_receive_bytes_total: HOST_NETWORK });
    renderWithData(<Metrics match={["worker:llama-sft-0"]} by="worker" />);
    const network = await screen.findByText(HOST_NETWORK);
    expect(network.closest("figure")?.getAttribute("aria-label")).toBe("Network received");
    expect(network.getAttribute("title")).toBe("llama-sft-0");
    // The others, measured but without samples in the range, say so as before.
    expect((await screen.findAllByText(/^No samples in this range/)).length).toBe(CHARTS.length - 1);
    // The network counter is asked for as a rate; the gauges are not.
    const networkAsked = asked.find((v) => v.metric === "task_network_receive_bytes_total");
    expect(networkAsked?.rate).toBe(true);
    expect(asked.find((v) => v.metric === "task_cpu_usage_cores")?.rate).toBe(false);
  });
});

// seed L-52: the charts of a run a few seconds old, or of a worker killed within seconds, show
// its life (a curve), not a fixed hour (a dot); the Memory chart draws the memory limit.
describe("Metrics of a short life (seed L-52)", () => {
  const now = Date.parse("2026-12-01T07:00:30Z");

  it("charts its life: start to end, or to now while it goes on", () => {
    const ended = { from: "2026-12-01T07:00:00Z", to: "2026-12-01T07:00:12Z" };
    expect(windowOf(null, ended, now)).toEqual({ start: 1796108399, end: 1796108413 });
    // a life of a second is still 10 s wide
    const blink = { from: "2026-12-01T07:00:00Z", to: "2026-12-01T07:00:01Z" };
    expect(windowOf(null, blink, now)).toEqual({ start: 1796108399, end: 1796108409 });
    // going on: from its start to now (end null), at least the last 10 s
    expect(windowOf(null, { from: "2026-12-01T07:00:25Z", to: null }, now)).toEqual({ start: 1796108420, end: null });
    // a range picked: the last hour, as before
    expect(windowOf(3600, ended, now)).toEqual({ start: 1796108430 - 3600, end: null });
  });

  it("asks each chart for the life's window, and the Memory chart for its limit too", async () => {
    const asked = answering({});
    renderWithData(<Metrics match={["worker:oom-0"]} by="worker" life={{ from: "2026-12-01T07:00:00Z", to: "2026-12-01T07:00:06Z" }} />);
    await screen.findAllByText(/^No samples in this range/);
    expect(new Set(asked.map((v) => `${String(v.start)}-${String(v.end)}`))).toEqual(new Set(["1796108399-1796108409"]));
    const limit = asked.find((v) => v.metric === "task_memory_limit_bytes");
    expect(limit).toMatchObject({ match: ["worker:oom-0"], by: "worker", rate: false });
    expect((screen.getByRole("combobox", { name: "Range" }) as HTMLSelectElement).selectedOptions[0].text).toBe("Its life");
  });

  it("draws the limit as its own series, in MiB below a GiB", () => {
    const used = [{ labels: { worker: "oom-0" }, points: [[1000, 100 * 2 ** 20], [2000, 250 * 2 ** 20]] as [number, number][] }];
    const limit = [{ labels: { worker: "oom-0" }, points: [[1000, 256 * 2 ** 20], [2000, 256 * 2 ** 20]] as [number, number][] }];
    const plot = plotOf("task_memory_used_bytes", "bytes", used, limit, 1000);
    expect(plot).toEqual({
      unit: "MiB",
      labels: ["oom-0", "limit of oom-0"],
      limits: [false, true],
      data: [
        [1, 2],
        [100, 250],
        [256, 256],
      ],
    });
    const big = plotOf("task_memory_used_bytes", "bytes", [{ labels: {}, points: [[1000, 3 * 2 ** 30]] }], [], 1000);
    expect(big).toMatchObject({ unit: "GiB", labels: ["task_memory_used_bytes"], data: [[1], [3]] });
  });
});

// issue 36: a chart drew its line straight across a minute without samples (the agent away),
// as if values between had been measured.
describe("Metrics with a gap in their samples", () => {
  const every5s = (from: number, count: number, value = 1): [number, number][] =>
    Array.from({ length: count }, (_, i) => [from + i * 5000, value + i] as [number, number]);

  it("breaks a line where samples stop for more than a few steps", () => {
    // samples every 5 s, answered in 1 s steps (a short life): 5 s apart is no gap
    expect(gapsOf(every5s(0, 10), 1000)).toEqual([]);
    // a minute without samples after 45 s: the line breaks a step after the last one
    const holed = [...every5s(0, 10), ...every5s(105_000, 4)];
    expect(gapsOf(holed, 1000)).toEqual([46_000]);
    // answered in 10 s steps, a sample a step: 40 s without one is a gap, 20 s is not
    const stepped: [number, number][] = [[0, 1], [10_000, 1], [20_000, 1], [40_000, 1], [80_000, 1], [90_000, 1]];
    expect(gapsOf(stepped, 10_000)).toEqual([50_000]);
    expect(gapsOf([[0, 1]], 1000)).toEqual([]);
  });

  it("gives uPlot a null in the gap, and carries the other series over the times it lacks", () => {
    const a = { labels: { worker: "ddp-0" }, points: [[0, 1], [10_000, 2], [20_000, 3], [80_000, 4], [90_000, 5]] as [number, number][] };
    const b = { labels: { worker: "ddp-1" }, points: [[5_000, 7], [15_000, 8], [25_000, 9]] as [number, number][] };
    const plot = plotOf("task_cpu_usage_cores", "cores", [a, b], [], 10_000);
    expect(plot.data).toEqual([
      [0, 5, 10, 15, 20, 25, 30, 80, 90],
      [1, undefined, 2, undefined, 3, undefined, null, 4, 5],
      [undefined, 7, undefined, 8, undefined, 9, undefined, undefined, undefined],
    ]);
  });
});
