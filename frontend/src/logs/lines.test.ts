import { describe, expect, it } from "vitest";

import { append, isError, isErrorLike, KEEP, saved, shown } from "./lines";

describe("log lines", () => {
  it("knows the seed's error-like lines", () => {
    for (const line of [
      "RuntimeError: boom",
      "Exception in thread",
      "Traceback (most recent call last):",
      "NCCL WARN Connect to 10.0.0.2 failed",
      "CUDA error: out of memory",
      "Killed",
    ]) {
      expect(isErrorLike(line)).toBe(true);
    }
    expect(isErrorLike("[rank1]: step 1200 loss 1.873 lr 2.0e-05")).toBe(false);
  });

  it("joins chunks that end mid-line and keeps the last 5 000", () => {
    let state = append([], "", "step 1\nste");
    expect(state).toEqual({ lines: ["step 1"], partial: "ste" });
    state = append(state.lines, state.partial, "p 2\n");
    expect(state).toEqual({ lines: ["step 1", "step 2"], partial: "" });
    const many = Array.from({ length: KEEP + 10 }, (_, i) => `line ${i}`).join("\n") + "\n";
    const kept = append([], "", many).lines;
    expect(kept).toHaveLength(KEEP);
    expect(kept[0]).toBe("line 10");
  });

  it("seed L-7: Errors only keeps the lines containing error, not every error-like line", () => {
    const lines = [
      "step 1",
      "Traceback (most recent call last):",
      '  File "train.py", line 3, in <module>',
      "RuntimeError: CUDA error: out of memory",
      "NCCL WARN Connect to 10.0.0.2 failed",
      "Killed",
      "torch.OutOfMemoryError: boom",
    ];
    expect(lines.filter(isErrorLike)).toHaveLength(5);
    expect(shown(lines, "", true)).toEqual(["RuntimeError: CUDA error: out of memory", "torch.OutOfMemoryError: boom"]);
    expect(isError("Traceback (most recent call last):")).toBe(false);
    expect(isError("Killed")).toBe(false);
  });

  it("seed L-8: Download saves what is shown after Find… and Errors only", () => {
    const lines = ["step 1", "CUDA error: boom", "step 2 error-free", "RuntimeError: bust"];
    expect(saved(shown(lines, "boom", true))).toBe("CUDA error: boom\n");
    expect(saved(shown(lines, "step", false))).toBe("step 1\nstep 2 error-free\n");
    expect(saved(shown(lines, "nothing like it", false))).toBe("");
  });

  it("filters by Find… and Errors only", () => {
    const lines = ["step 1", "CUDA error: boom", "step 2 error-free"];
    expect(shown(lines, "", true)).toEqual(["CUDA error: boom", "step 2 error-free"]);
    expect(shown(lines, "STEP", false)).toEqual(["step 1", "step 2 error-free"]);
    expect(shown(lines, "boom", true)).toEqual(["CUDA error: boom"]);
  });
});
