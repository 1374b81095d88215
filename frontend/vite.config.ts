import { defineConfig } from "vitest/config";
import react from "@vitejs/plugin-react";

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
    environment: "jsdom",
    include: ["src/**/*.test.{ts,tsx}"],
    setupFiles: ["src/test-setup.ts"],
    testTimeout: 30_000, // longer than a findBy's wait (src/test-setup.ts)
  },
});
