// @vitest-environment node
// The generated types are checked for drift in the tests (issue 22), as schema.graphql is by
// schema-check: a change of the schema or of a page's operation without `npm run codegen` fails
// here with the difference (an operation the schema does not answer fails in generate()).
import { generate } from "@graphql-codegen/cli";
import { describe, expect, it } from "vitest";

import config from "../../codegen";

describe("the console's generated GraphQL types", () => {
  it("are what codegen makes of schema.graphql and the pages' operations now (else: npm run codegen)", async () => {
    const [made] = await generate({ ...config, silent: true }, false);
    expect(made.filename).toBe("src/generated/graphql.ts");
    await expect(made.content).toMatchFileSnapshot("./graphql.ts");
  }, 60_000);
});
