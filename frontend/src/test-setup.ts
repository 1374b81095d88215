// The console's component tests run beside the whole suite on a 2-core machine (make test): a
// page's first answer can take seconds to render there, longer than Testing Library's 1 s
// default for findBy…/waitFor (CI: "Unable to find role=table" after 1.7 s). A wait that
// times out still fails; it only waits as long as a loaded machine needs.
import { cleanup, configure } from "@testing-library/react";
import { afterEach } from "vitest";

configure({ asyncUtilTimeout: 15_000 });

// Files share a worker's DOM (vite.config.ts's "shared" project): what a test rendered goes
// when it ends, whether or not its file says so.
afterEach(cleanup);
