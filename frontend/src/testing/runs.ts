// Runs and workers as the run page's query answers them (RunQuery), for component tests: a
// run of a given state, its workers from keyword-like overrides.
import type { Run, Worker } from "../pages/run/model";

const AT = "2026-10-01T01:02:11Z";

export function aWorker(overrides: Partial<Worker> = {}): Worker {
  return {
    name: "llama-sft-0",
    rank: 0,
    state: "Running",
    reason: "Container running",
    stateSince: AT,
    gpus: 2,
    gpuIds: [0, 1],
    restarts: 0,
    restartAt: null,
    exitCode: null,
    lastFailure: null,
    machine: "gpu-07",
    lastPlacement: { machine: "gpu-07", gpuIds: [0, 1] },
    straggler: false,
    advice: null,
    ...overrides,
  };
}

export function aRun(overrides: Partial<Run> = {}): Run {
  return {
    name: "llama-sft",
    cluster: "local",
    state: "Running",
    reason: "2 of 2 workers running",
    priority: 50,
    createdAt: AT,
    stateSince: AT,
    endedAt: null,
    createdBy: "admin",
    spec: { name: "llama-sft", gpus: 2, workers: 2 },
    ettr: null,
    history: [],
    pendingReasons: [],
    goodput: {
      allocatedGpuHours: 0,
      productiveGpuHours: 0,
      lostGpuHours: 0,
      waitingGpuHours: 0,
      goodput: null,
      gpuHours: [],
      biggestLoss: null,
    },
    rework: { gpuHours: null, redos: [] },
    failedWorker: null,
    advice: null,
    restartLoop: null,
    waitAdvice: null,
    slurm: null,
    idlePolicy: null,
    code: null,
    workers: [aWorker(), aWorker({ name: "llama-sft-1", rank: 1, machine: "gpu-08", lastPlacement: { machine: "gpu-08", gpuIds: [0, 1] } })],
    ...overrides,
  };
}
