import { describe, expect, it } from "vitest";

import { runOf } from "./names";

describe("runOf", () => {
  it("is the worker's name less its rank (<run>-<rank>)", () => {
    expect(runOf("llama-sft-1")).toBe("llama-sft");
    expect(runOf("sweep-7-0")).toBe("sweep-7");
  });
});
