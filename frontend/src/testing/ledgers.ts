import type { Ledger } from "../ledger";

// sweep-7's row of the seed's table (goodput.txt): HELD 146.5, USED 112.4, IDLE 21.0, START
// 7.7, PREEMPT 3.3, WAITING 18.0 (with its START as our rows add it up: 146.5 - 136.7 = 9.8).
export const SWEEP_7: Ledger = {
  allocatedGpuHours: 146.5,
  productiveGpuHours: 112.4,
  lostGpuHours: 52.1,
  waitingGpuHours: 18.0,
  goodput: 112.4 / 146.5,
  gpuHours: [
    { category: "productive", gpuHours: 112.4, heldGpuHours: 112.4 },
    { category: "idle", gpuHours: 21.0, heldGpuHours: 21.0 },
    { category: "starting", gpuHours: 9.8, heldGpuHours: 9.8 },
    { category: "preemption", gpuHours: 21.3, heldGpuHours: 3.3 },
  ],
  biggestLoss: { category: "idle", gpuHours: 21.0, heldGpuHours: 21.0 },
};
