import { describe, expect, it } from "vitest";

import { formatDuration, parseDuration, secondsShown } from "./durations";

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

  it("says seconds as the server's sentences do (issue 41, seconds_shown)", () => {
    expect(secondsShown(20)).toBe("20 s");
    expect(secondsShown(0)).toBe("0.0 s");
    expect(secondsShown(0.284)).toBe("0.3 s");
    expect(secondsShown(9.9)).toBe("9.9 s");
    expect(secondsShown(59.4)).toBe("59 s");
    expect(secondsShown(59.6)).toBe("1 min");
    expect(secondsShown(120)).toBe("2 min");
    expect(secondsShown(26 * 60 + 10)).toBe("26 min");
    expect(secondsShown(60_000)).toBe("16 h 40 min");
    expect(secondsShown(3 * 3600)).toBe("3 h");
    expect(secondsShown(2 * 86_400 + 3 * 3600 + 90)).toBe("2 d 3 h 2 min");
    expect(secondsShown(150)).toBe("2 min"); // 2.5 min: to the even neighbour, as Python's round()
  });
});
