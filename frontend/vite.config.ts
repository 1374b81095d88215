import { configDefaults, defineConfig } from "vitest/config";
import react from "@vitejs/plugin-react";
import { OWN_GRAPH } from "./src/testing/ownGraph.ts";

// `npm run dev` serves the console on :5173 and sends the API's paths to a local
// `astraeus up` on :8080; the built bundle (dist/) is served by the API server itself.
const api = process.env.ASTRAEUS_API_URL ?? "http://127.0.0.1:8080";

export default defineConfig({
  plugins: [react()],
  build: { outDir: "dist", sourcemap: true, chunkSizeWarningLimit: 400 },
  server: {
    proxy: {
      "/graphql": { target: api, ws: true },
      "/v1": api,
      "/api": api,
    },
  },
  test: {
    // Two projects (issue 39): a file that stubs a global or mocks a module runs in a module
    // graph and a DOM of its own, as Vitest does by default; every other file shares its
    // worker's. A jsdom and the console's modules made anew for each of 25 files took 32 CPU-s
    // of `make test`'s 2 cores; these two projects take 14. What a test rendered is removed
    // after it (src/test-setup.ts); the files pass in any order (vitest --sequence.shuffle).
    projects: [
      {
        extends: true,
        test: {
          name: "shared",
          include: ["src/**/*.test.{ts,tsx}"],
          exclude: [...configDefaults.exclude, ...OWN_GRAPH],
          isolate: false,
        },
      },
      { extends: true, test: { name: "own", include: OWN_GRAPH } },
    ],
    environment: "jsdom",
    setupFiles: ["src/test-setup.ts"],
    testTimeout: 30_000, // longer than a findBy's wait (src/test-setup.ts)
  },
});
