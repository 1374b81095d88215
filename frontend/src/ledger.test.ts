import { describe, expect, it } from "vitest";

import { biggestHeldLoss, notProductive, segments, type Ledger } from "./ledger";
import { SWEEP_7 } from "./testing/ledgers";

describe("segments", () => {
  it("splits the time asked for into each category's held part, then waiting", () => {
    const found = segments(SWEEP_7);
    expect(found.map((s) => s.category)).toEqual(["productive", "idle", "starting", "preemption", "waiting"]);
    // a wait to be placed again (preemption, not held) shows as waiting, not as preemption
    expect(found.find((s) => s.category === "preemption")?.gpuHours).toBe(3.3);
    expect(found.find((s) => s.category === "waiting")?.gpuHours).toBe(18.0);
    const total = found.reduce((sum, s) => sum + s.share, 0);
    expect(total).toBeCloseTo(1, 10);
    expect(found[0].share).toBeCloseTo(112.4 / (146.5 + 18.0), 10);
  });

  it("has no segment for nothing, and no share when nothing was asked", () => {
    const empty: Ledger = { ...SWEEP_7, allocatedGpuHours: 0, productiveGpuHours: 0, waitingGpuHours: 0, gpuHours: [] };
    expect(segments(empty)).toEqual([]);
  });
});

describe("notProductive", () => {
  it("is held less productive", () => {
    expect(notProductive(SWEEP_7)).toBeCloseTo(34.1, 10);
  });
});

describe("biggestHeldLoss", () => {
  it("is the held category other than productive with the most time", () => {
    expect(biggestHeldLoss(SWEEP_7)?.category).toBe("idle");
    // preemption has more time in all (21.3) but most of it was not held: waiting, not a loss
    const moreWaiting = { ...SWEEP_7, gpuHours: SWEEP_7.gpuHours.map((c) => (c.category === "idle" ? { ...c, heldGpuHours: 1 } : c)) };
    expect(biggestHeldLoss(moreWaiting)?.category).toBe("starting");
    expect(biggestHeldLoss({ ...SWEEP_7, gpuHours: [] })).toBeNull();
  });
});
