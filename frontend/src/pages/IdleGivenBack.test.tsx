import { cleanup, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { renderWithData } from "../testing/render";
import { IdleGivenBack } from "./IdleGivenBack";

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

type Report = { idleReport: Record<string, unknown> };

const SINCE = "2026-09-24T01:00:00Z";
// idleReport's answer (issue 41): sweep-7 stopped after 30 idle minutes on 4 GPUs, giving back
// 4 GPUs from its stop to now; llama-sft's workspace told once (a notice gives nothing back).
// The figures take decimalsFor's digits: three significant for the smallest, 2 GPU-h.
const TWO = {
  idleReport: {
    since: SINCE,
    gpuHoursGivenBack: 12,
    idleGpuHoursFound: 2,
    runsStopped: 1,
    actions: [
      {
        run: "llama-sft",
        action: "notify",
        at: "2026-10-01T04:00:00Z",
        idleSince: "2026-10-01T02:00:00Z",
        gpus: 2,
        reason: "Idle: GPU utilization under 10% for 2 h",
        gpuHoursGivenBack: 0,
      },
      {
        run: "sweep-7",
        action: "stop",
        at: "2026-10-01T01:30:00Z",
        idleSince: "2026-10-01T01:00:00Z",
        gpus: 4,
        reason: "Stopped — idle: GPU utilization under 5% for 30 min",
        gpuHoursGivenBack: 12,
      },
    ],
  },
};
const NONE = { idleReport: { since: SINCE, gpuHoursGivenBack: 0, idleGpuHoursFound: 0, runsStopped: 0, actions: [] } };

function answering(data: Report) {
  const asked: Record<string, unknown>[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (_url: string, init: RequestInit) => {
      const { query, variables } = JSON.parse(String(init.body)) as { query: string; variables: Record<string, unknown> };
      expect(query).toContain("idleReport(days: 7");
      asked.push(variables);
      return new Response(JSON.stringify({ data }), { status: 200 });
    }),
  );
  return asked;
}

describe("Idle GPUs given back (issue 41)", () => {
  it("says no idle policy stopped a run, and how a spec asks for one, when none did", async () => {
    const asked = answering(NONE);
    renderWithData(<IdleGivenBack org="acme" workspace="ml" />);
    const section = await screen.findByRole("region", { name: "Idle GPUs given back" });
    expect(asked).toEqual([{ ws: "ml" }]);
    expect(section.querySelector("p.empty")?.textContent).toBe(
      'No idle policy stopped a run in the last 7 days: a run\'s spec may say idle: {gpu_utilization_below: 5, for: "30m"} to be stopped when every GPU it holds stays under 5% for 30 minutes.',
    );
    expect(within(section).queryByRole("table")).toBeNull();
    expect(section.querySelector("dl.summary")).toBeNull();
  });

  it("shows what the stops gave back, the idle time found, and each action linking to its run", async () => {
    answering(TWO);
    renderWithData(<IdleGivenBack org="acme" workspace="ml" />);
    const section = await screen.findByRole("region", { name: "Idle GPUs given back" });
    const figure = (f: string) => section.querySelector(`dl [data-figure="${f}"]`)?.textContent;
    expect(figure("given-back")).toBe("12.00 GPU-h");
    expect(figure("idle-found")).toBe("2.00 GPU-hheld idle by the stopped runs over their windows");
    expect(figure("runs-stopped")).toBe("1 run");
    const table = within(section).getByRole("table", { name: "Idle actions" });
    expect(within(table).getAllByRole("columnheader").map((h) => h.textContent)).toEqual([
      "Run",
      "What",
      "When",
      "GPUs",
      "GPU-hours given back",
    ]);
    const rows = within(table).getAllByRole("row").slice(1).map((r) => Array.from(r.children).map((c) => c.textContent));
    expect(rows).toEqual([
      ["llama-sft", "Idle: GPU utilization under 10% for 2 h", "2026-10-01 04:00:00 UTC", "2", "—"],
      ["sweep-7", "Stopped — idle: GPU utilization under 5% for 30 min", "2026-10-01 01:30:00 UTC", "4", "12.00"],
    ]);
    const stopped = table.querySelector('tr[data-row="sweep-7"]')!;
    expect(within(stopped as HTMLElement).getByRole("link", { name: "sweep-7" }).getAttribute("href")).toBe(
      "/o/acme/w/ml/runs/sweep-7",
    );
    expect(stopped.querySelector('[data-figure="at"]')?.getAttribute("title")).toBe("Idle since 2026-10-01 01:00:00 UTC");
    expect(section.querySelector("p.empty")).toBeNull();
  });
});
