// @vitest-environment node
// The categories' labels and colours are keyed by the schema's GoodputCategory (issue 22): the
// type check holds the table to the generated type, and this holds both to schema.graphql as
// the server exports it, so a category the server adds or renames is shown, not dropped.
import { buildSchema, GraphQLEnumType } from "graphql";
import { describe, expect, it } from "vitest";

import schemaText from "../../schema.graphql?raw";
import { CATEGORIES, STYLE } from "./categories";

function schemaCategories(): string[] {
  const schema = buildSchema(schemaText);
  const found = schema.getType("GoodputCategory");
  if (!(found instanceof GraphQLEnumType)) throw new Error("schema.graphql has no enum GoodputCategory");
  return found.getValues().map((v) => v.value as string);
}

describe("the goodput categories", () => {
  it("are every category of the schema, each once, with a label, a colour and a meaning", () => {
    const ours = CATEGORIES.map((c) => c.category);
    expect([...ours].sort()).toEqual(schemaCategories().sort());
    expect(new Set(ours).size).toBe(ours.length);
    for (const c of CATEGORIES) {
      expect(c.label, c.category).toMatch(/^[A-Z][a-z]+$/);
      expect(c.colour, c.category).toMatch(/^#[0-9a-f]{6}$/);
      expect(c.meaning, c.category).not.toBe("");
      expect(STYLE[c.category]).toBe(c);
    }
    expect(new Set(CATEGORIES.map((c) => c.colour)).size).toBe(CATEGORIES.length);
  });

  it("are in the bar's order: used, then each loss while held, then waiting", () => {
    expect(CATEGORIES.map((c) => c.label)).toEqual([
      "Productive",
      "Idle",
      "Stalled",
      "Starting",
      "Restart",
      "Failure",
      "Preemption",
      "Waiting",
    ]);
  });
});
