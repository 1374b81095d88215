import { describe, expect, it } from "vitest";

import { parse, runPath, workerPath } from "./routes";

describe("routes", () => {
  it("reads the seed's paths", () => {
    expect(parse("/o/acme/w/ml/goodput")).toEqual({ page: "goodput", org: "acme", workspace: "ml" });
    expect(parse("/o/acme/w/ml/runs/llama-sft", "?tab=logs&worker=llama-sft-1")).toEqual({
      page: "run",
      org: "acme",
      workspace: "ml",
      run: "llama-sft",
      tab: "logs",
      worker: "llama-sft-1",
    });
    // seed L-27: a worker at /o/<org>/w/<workspace>/workers/<cluster>/<worker>
    expect(parse("/o/acme/w/ml/workers/local/llama-sft-1")).toEqual({
      page: "worker",
      org: "acme",
      workspace: "ml",
      cluster: "local",
      worker: "llama-sft-1",
    });
    expect(parse("/o/acme/w/ml/runs/x", "?tab=nonsense")).toMatchObject({ tab: "workers" });
    expect(parse("/nowhere").page).toBe("notfound");
  });

  it("writes them back", () => {
    expect(runPath("acme", "ml", "llama-sft", "logs", "llama-sft-1")).toBe(
      "/o/acme/w/ml/runs/llama-sft?tab=logs&worker=llama-sft-1",
    );
    expect(runPath("acme", "ml", "llama-sft")).toBe("/o/acme/w/ml/runs/llama-sft");
    expect(workerPath("acme", "ml", "local", "llama-sft-1")).toBe("/o/acme/w/ml/workers/local/llama-sft-1");
  });
});
