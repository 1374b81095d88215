import { describe, expect, it } from "vitest";

import { memory } from "./format";

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
