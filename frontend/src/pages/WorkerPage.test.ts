import { describe, expect, it } from "vitest";

import { memoryAsked } from "./WorkerPage";

// issue 21: "Asked for … 0 GiB" for 256 MiB: sizes in MiB below a GiB, as the CLI writes them.
describe("a worker's Asked for", () => {
  it("says its memory limit in MiB below a GiB", () => {
    expect(memoryAsked({ memory_bytes: 256 * 2 ** 20 }, 1)).toBe("256 MiB");
    expect(memoryAsked({ memory_bytes: 24 * 2 ** 30 }, 1)).toBe("24 GiB");
  });

  it("counts per_gpu.memory_bytes once per GPU it asks for, and says nothing without a limit", () => {
    expect(memoryAsked({ per_gpu: { memory_bytes: 3 * 2 ** 29 } }, 2)).toBe("3 GiB");
    expect(memoryAsked({ per_gpu: null }, 2)).toBeNull();
    expect(memoryAsked({}, 1)).toBeNull();
  });
});
