import { describe, expect, it } from "vitest";

import { runLife, workerLife } from "./life";

// seed L-52: the metrics' default range is the run's or the worker's life.
describe("life", () => {
  it("a run's: from its first placement to its end", () => {
    const history = [
      { transitionAt: "2026-12-01T07:00:09Z", state: "Failed" },
      { transitionAt: "2026-12-01T07:00:03Z", state: "Running" },
      { transitionAt: "2026-12-01T07:00:02Z", state: "Starting" },
      { transitionAt: "2026-12-01T06:00:00Z", state: "Pending" },
    ];
    expect(runLife({ createdAt: "2026-12-01T06:00:00Z", endedAt: "2026-12-01T07:00:09Z", history })).toEqual({
      from: "2026-12-01T07:00:02.000Z",
      to: "2026-12-01T07:00:09Z",
    });
    // never placed: from its creation, going on
    expect(runLife({ createdAt: "2026-12-01T06:00:00Z", endedAt: null, history: history.slice(3) })).toEqual({
      from: "2026-12-01T06:00:00Z",
      to: null,
    });
  });

  it("a worker's: to the time it ended, or now while it goes on", () => {
    const history = [
      { transitionAt: "2026-12-01T07:00:04Z", state: "Running" },
      { transitionAt: "2026-12-01T07:00:02Z", state: "Starting" },
    ];
    expect(workerLife({ state: "Failed", stateSince: "2026-12-01T07:00:05Z", history })).toEqual({
      from: "2026-12-01T07:00:02.000Z",
      to: "2026-12-01T07:00:05Z",
    });
    expect(workerLife({ state: "Running", stateSince: "2026-12-01T07:00:04Z", history })).toMatchObject({ to: null });
  });
});
