import { describe, expect, it } from "vitest";
import { OWN_GRAPH } from "./testing/ownGraph";

// Every test file, as its text.
const FILES = import.meta.glob<string>("./**/*.test.{ts,tsx}", {
  query: "?raw",
  import: "default",
  eager: true,
});
const REPLACES = /\bvi\.(mock|doMock|stubGlobal|stubEnv)\(/;

describe("the test files that replace a global or a module", () => {
  it("each runs in a module graph of its own", () => {
    const replacing = Object.entries(FILES)
      .filter(([name, text]) => name !== "./ownGraph.test.ts" && REPLACES.test(text))
      .map(([name]) => `src/${name.slice(2)}`)
      .sort();
    expect(replacing).toEqual([...OWN_GRAPH].sort());
  });
});
