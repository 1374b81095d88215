import { describe, expect, it } from "vitest";

import { formatDuration, parseDuration } from "./durations";

describe("durations", () => {
  it("reads the specification's durations", () => {
    expect(parseDuration("12h")).toBe(12 * 3_600_000);
    expect(parseDuration("1h30m")).toBe(90 * 60_000);
    expect(parseDuration("45s")).toBe(45_000);
    expect(parseDuration("soon")).toBeNull();
    expect(parseDuration(null)).toBeNull();
  });

  it("shows the two biggest units", () => {
    expect(formatDuration(90 * 60_000)).toBe("1h 30m");
    expect(formatDuration(26 * 3_600_000)).toBe("1d 2h");
    expect(formatDuration(61_000)).toBe("1m 1s");
    expect(formatDuration(-5)).toBe("0s");
  });
});
