import { cleanup, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { renderWithData } from "../../testing/render";
import { aRun } from "../../testing/runs";
import { codeText, Readout } from "./Readout";

afterEach(() => {
  cleanup();
  vi.unstubAllGlobals();
});

// The readout of a running run reads its workers' latest samples (/v1/tasks): none here.
function readout(run: ReturnType<typeof aRun>) {
  vi.stubGlobal(
    "fetch",
    vi.fn(async () => new Response(JSON.stringify({ tasks: [] }), { status: 200 })),
  );
  renderWithData(<Readout run={run} />);
  const dl = screen.getByLabelText("Readout");
  return {
    labels: Array.from(dl.querySelectorAll("dt")).map((d) => d.textContent),
    policy: dl.querySelector('[data-figure="idle-policy"]')?.textContent ?? null,
  };
}

describe("the readout's idle policy (issue 41)", () => {
  it("says the run is stopped when every GPU stays under its utilization for its window", () => {
    const run = aRun({ idlePolicy: { gpuUtilizationBelow: 5, window: "30m", action: "stop" } });
    const { labels, policy } = readout(run);
    expect(labels[labels.length - 1]).toBe("Idle policy");
    expect(policy).toBe("Stop when every GPU stays under 5% for 30m");
  });

  it("says the workspace is told for a notify policy, with the spec's figures as given", () => {
    const run = aRun({ idlePolicy: { gpuUtilizationBelow: 2.5, window: "2h", action: "notify" } });
    expect(readout(run).policy).toBe("Tell the workspace when every GPU stays under 2.5% for 2h");
  });

  it("has no Idle policy item where the run has none", () => {
    const { labels, policy } = readout(aRun());
    expect(labels).not.toContain("Idle policy");
    expect(policy).toBeNull();
  });
});

describe("the readout's code (issue 41)", () => {
  const digest = `sha256:${"6921375a022f".padEnd(64, "0")}`;

  it("shows the digest it ships with, its files and size, the whole digest on hover", () => {
    vi.stubGlobal("fetch", vi.fn(async () => new Response(JSON.stringify({ tasks: [] }), { status: 200 })));
    renderWithData(<Readout run={aRun({ code: { digest, size: 12_288, files: 6, stored: true } })} />);
    const item = screen.getByLabelText("Readout").querySelector('[data-figure="code"]');
    expect(item?.textContent).toBe("sha256:6921375a022f… · 6 files, 12.0 KiB");
    expect(item?.getAttribute("title")).toBe(digest);
  });

  it("says when its code is no longer stored, and has no Code item without code", () => {
    expect(codeText({ digest, size: null, files: null, stored: false })).toBe(
      "sha256:6921375a022f… · no longer stored: submit it again with --workdir",
    );
    expect(codeText({ digest, size: 3 * 2 ** 30, files: 1, stored: true })).toBe(
      "sha256:6921375a022f… · 1 file, 3 GiB",
    );
    expect(readout(aRun()).labels).not.toContain("Code");
  });
});
