import { describe, expect, it } from "vitest";

import { counted, gpuHours, memory, plural } from "./format";

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

describe("gpuHours", () => {
  it("says one decimal from a GPU-hour, as the seed's table does", () => {
    expect(gpuHours(323.14)).toBe("323.1");
    expect(gpuHours(21)).toBe("21.0");
    expect(gpuHours(1.04)).toBe("1.0");
    expect(gpuHours(1234.56)).toBe("1,234.6");
    expect(gpuHours(0)).toBe("0.0");
  });

  it("says two significant digits below one, so a small figure is not 0.0 (issue 36)", () => {
    // the run: HELD 0.2 USED 0.0 GOODPUT 15%; now its figures agree with its goodput
    expect([gpuHours(0.2), gpuHours(0.03)]).toEqual(["0.20", "0.030"]);
    expect(gpuHours(0.95)).toBe("0.95");
    expect(gpuHours(8 / 3600)).toBe("0.0022"); // 8 GPU-seconds
    expect(gpuHours(1 / 3600)).toBe("0.00028"); // one GPU-second
    // rounding up to the next decade keeps two digits
    expect(gpuHours(0.0996)).toBe("0.10");
    expect(gpuHours(0.999)).toBe("1.0");
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
