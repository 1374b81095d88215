import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { CHARTS, Metrics } from "./Metrics";

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
    render(<Metrics match={["worker:llama-sft-0"]} by="worker" />);
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
