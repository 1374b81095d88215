// The console's test files that replace a global (vi.stubGlobal) or a module (vi.mock): each
// runs in a module graph and a DOM of its own (vite.config.ts's "own" project); the others
// share their worker's. src/ownGraph.test.ts fails when a file that replaces one is missing.
export const OWN_GRAPH = [
  "src/useQuery.test.tsx",
  "src/logs/LogView.test.tsx",
  "src/pages/IdleGivenBack.test.tsx",
  "src/pages/MachinesPage.test.tsx",
  "src/pages/Metrics.test.tsx",
  "src/pages/run/CheckpointAdvice.test.tsx",
  "src/pages/run/Readout.test.tsx",
];
