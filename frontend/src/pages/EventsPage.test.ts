import { describe, expect, it } from "vitest";

import { foundLater } from "./EventsPage";

// issue 21: a stall is dated from the worker's last progress and found later; the Events page
// shows both times where they differ.
describe("an event's times", () => {
  it("shows when it was found beside when it happened, where they differ", () => {
    expect(foundLater({ createdAt: "2026-12-01T07:00:01Z", foundAt: "2026-12-01T07:00:21.400Z" })).toBe(
      "2026-12-01 07:00:21 UTC",
    );
    expect(foundLater({ createdAt: "2026-12-01T07:00:01.200Z", foundAt: "2026-12-01T07:00:01.900Z" })).toBeNull();
    expect(foundLater({ createdAt: "2026-12-01T07:00:01Z", foundAt: "2026-12-01T07:00:01Z" })).toBeNull();
  });
});
