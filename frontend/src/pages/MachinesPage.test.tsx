import { cleanup, screen, within } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { renderWithData } from "../testing/render";
import { MachinesPage } from "./MachinesPage";

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

// machineHealth's answer (issue 23): gpu-07 a lemon, gpu-08 fine (not listed as costly).
const HEALTH = {
  machineHealth: {
    machines: [
      {
        machine: "gpu-07",
        cluster: "local",
        pool: "h100",
        lostGpuHours: 12.44,
        failureCount: 5,
        failures: [{ kind: "program", count: 5 }],
        faultCount: 0,
        lastFault: null,
        unhealthyGpus: 0,
        vsPool: 5,
        action: "drain: 5× its pool's failures this week",
      },
      {
        machine: "gpu-08",
        cluster: "local",
        pool: "h100",
        lostGpuHours: 0,
        failureCount: 0,
        failures: [],
        faultCount: 0,
        lastFault: null,
        unhealthyGpus: 0,
        vsPool: null,
        action: "none",
      },
    ],
  },
};

// The server's answers, as tests/test_quota_surfaces.py has it answer an admin: one machine of
// cluster local; team-b's quota of 2 GPUs; workers_stalled set to 3, the others the defaults.
function answering() {
  const asked: Record<string, unknown>[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (_url: string, init: RequestInit) => {
      const { query, variables } = JSON.parse(String(init.body)) as { query: string; variables: Record<string, unknown> };
      asked.push(variables);
      if (query.includes("machineHealth")) return new Response(JSON.stringify({ data: HEALTH }), { status: 200 });
      const data = query.includes("thresholds")
        ? {
            quotas: [{ workspace: "team-b", cluster: String(variables.c), gpus: 2 }],
            thresholds: [
              { name: "goodput_drop.below", value: 0.5, default: 0.5, updatedAt: null },
              { name: "workers_stalled", value: 3, default: 1, updatedAt: "2026-10-01T01:02:11Z" },
            ],
          }
        : {
            machines: [
              {
                name: "gpu-07",
                cluster: "local",
                pool: null,
                state: "ready",
                reason: "",
                cpuCores: 64,
                memoryBytes: 512 * 2 ** 30,
                gpus: 8,
                unhealthyGpus: 0,
                lastSeenAt: null,
                isolation: "Enforced: its own unprivileged user, a private /tmp and /var/tmp",
                isolationNotEnforced: [],
              },
              {
                name: "laptop",
                cluster: "local",
                pool: null,
                state: "ready",
                reason: "",
                cpuCores: 8,
                memoryBytes: 16 * 2 ** 30,
                gpus: 1,
                unhealthyGpus: 0,
                lastSeenAt: null,
                isolation: "Nothing enforced. Not enforced: its own unprivileged user, a private /tmp and /var/tmp",
                isolationNotEnforced: ["unprivileged_user", "private_tmp"],
              },
            ],
            pools: [],
          };
      return new Response(JSON.stringify({ data }), { status: 200 });
    }),
  );
  return asked;
}

describe("MachinesPage", () => {
  it("shows each cluster's quotas and alert thresholds under its machines (issue 21)", async () => {
    const asked = answering();
    renderWithData(<MachinesPage />);
    const quotas = await screen.findByRole("table", { name: "Quotas on local" });
    const teamB = within(quotas).getByRole("row", { name: /team-b/ });
    expect(within(teamB).getByText("2")).toBeTruthy();
    const thresholds = screen.getByRole("table", { name: "Alert thresholds of local" });
    const stalled = within(thresholds).getByRole("row", { name: /workers_stalled/ });
    expect(within(stalled).getByText("3")).toBeTruthy();
    expect(within(stalled).getByText("1")).toBeTruthy();
    const below = within(thresholds).getByRole("row", { name: /goodput_drop.below/ });
    expect(within(below).getByText("default")).toBeTruthy();
    expect(asked).toContainEqual({ c: "local" });
  });

  it("lists the costly machines with what to do, not the fine ones (issue 23)", async () => {
    answering();
    renderWithData(<MachinesPage />);
    const costly = await screen.findByRole("table", { name: "Costly machines" });
    const lemon = within(costly).getByRole("row", { name: /gpu-07/ });
    expect(within(lemon).getByText("drain: 5× its pool's failures this week")).toBeTruthy();
    expect(within(lemon).getByText("12.4")).toBeTruthy();
    expect(within(lemon).getByText("5.0×")).toBeTruthy();
    expect(within(costly).queryByRole("row", { name: /gpu-08/ })).toBeNull();
  });

  it("says which machines do not keep their workloads apart, and what they do not enforce (issue 37)", async () => {
    answering();
    renderWithData(<MachinesPage />);
    const section = await screen.findByRole("region", { name: "Workload isolation not enforced" });
    const items = within(section).getAllByRole("listitem");
    expect(items.map((item) => item.textContent)).toEqual([
      "laptop: Nothing enforced. Not enforced: its own unprivileged user, a private /tmp and /var/tmp",
    ]);
  });

  it("shows the refusal when the limits are refused", async () => {
    vi.stubGlobal(
      "fetch",
      vi.fn(async (_url: string, init: RequestInit) => {
        const { query } = JSON.parse(String(init.body)) as { query: string };
        if (query.includes("machineHealth")) return new Response(JSON.stringify({ data: HEALTH }), { status: 200 });
        const body = query.includes("thresholds")
          ? {
              data: null,
              errors: [
                {
                  message: "Only the organisation's admins read every workspace's quota.",
                  extensions: { code: "FORBIDDEN" },
                },
              ],
            }
          : { data: { machines: [{ name: "gpu-07", cluster: "local", pool: null, state: "ready", reason: "", cpuCores: 8, memoryBytes: 2 ** 30, gpus: 1, unhealthyGpus: 0, lastSeenAt: null, isolation: "Enforced: everything", isolationNotEnforced: [] }], pools: [] } };
        return new Response(JSON.stringify(body), { status: 200 });
      }),
    );
    renderWithData(<MachinesPage />);
    expect(await screen.findByText("Only the organisation's admins read every workspace's quota.")).toBeTruthy();
  });
});
