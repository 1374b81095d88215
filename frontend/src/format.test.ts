import { describe, expect, it } from "vitest";

import { counted, decimalsFor, gpuHours, memory, plural } from "./format";

describe("memory", () => {
  // Each figure is what the CLI's memory_text (backend/scheduling/placement.py) says for the
  // same bytes.
  it("says MiB below a GiB, as the CLI does (issue 21: not 0 GiB or 0.0 GiB)", () => {
    expect(memory(256 * 2 ** 20)).toBe("256 MiB");
    expect(memory(12.4 * 2 ** 20)).toBe("12 MiB");
    expect(memory(512.5 * 2 ** 20)).toBe("512 MiB"); // Python's round: a half to the even
    expect(memory(513.5 * 2 ** 20)).toBe("514 MiB");
    expect(memory(0)).toBe("0 MiB");
  });

  it("says GiB to one decimal from a GiB, without it when whole", () => {
    expect(memory(2 ** 30)).toBe("1 GiB");
    expect(memory(23.5406 * 2 ** 30)).toBe("23.5 GiB");
    expect(memory(80 * 2 ** 30)).toBe("80 GiB");
    expect(memory(79.97 * 2 ** 30)).toBe("80 GiB");
  });
});

describe("GPU-hours' digits, as the CLI's goodput table chooses them (issue 36)", () => {
  // tests/test_cli_goodput.py test_the_smallest_held_keeps_three_digits, case for case
  it.each([
    [469.6, 1],
    [10.0, 1],
    [9.99, 2],
    [1.0, 2],
    [0.2, 3],
    [0.05, 4],
    [1 / 3600, 6],
  ])("a smallest held of %f gives %i decimals", (smallest, decimals) => {
    expect(decimalsFor([469.6, smallest, 0])).toBe(decimals);
  });

  it("keeps the seed's one decimal where nothing is held", () => {
    expect(decimalsFor([])).toBe(1);
    expect(decimalsFor([0, 0])).toBe(1);
  });

  it("writes a figure to them, thousands grouped", () => {
    expect(gpuHours(323.14)).toBe("323.1");
    expect(gpuHours(21)).toBe("21.0");
    expect(gpuHours(1234.56)).toBe("1,234.6");
    expect(gpuHours(0.03, 3)).toBe("0.030");
    expect(gpuHours(1 / 3600, 6)).toBe("0.000278");
  });
});

describe("counted", () => {
  it("says one worker, not 1 workers (issue 36)", () => {
    expect(counted(1, "worker")).toBe("1 worker");
    expect(counted(2, "worker")).toBe("2 workers");
    expect(counted(0, "GPU")).toBe("0 GPUs");
    expect(counted(1200, "line")).toBe("1,200 lines");
    expect(plural(1, "restart")).toBe("restart");
  });
});
