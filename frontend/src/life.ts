// A run's or a worker's life, the metrics' default range (seed L-52): from its first placement
// (its creation while it never left Pending) to its end, or now while it goes on.

export interface Life {
  from: string;
  to: string | null;
}

export const ENDED = new Set(["Completed", "Failed", "Stopped", "Deleted"]);

interface Transition {
  transitionAt: string;
  state: string;
}

// The earliest transition out of Pending, else `created`.
function placedAt(history: Transition[], created: string): string {
  const times = history.filter((h) => h.state !== "Pending").map((h) => Date.parse(h.transitionAt));
  return times.length ? new Date(Math.min(...times)).toISOString() : created;
}

export function runLife(run: { createdAt: string; endedAt: string | null; history: Transition[] }): Life {
  return { from: placedAt(run.history, run.createdAt), to: run.endedAt };
}

export function workerLife(worker: { state: string; stateSince: string; history: Transition[] }): Life {
  const first = worker.history.map((h) => h.transitionAt).sort()[0] ?? worker.stateSince;
  return { from: placedAt(worker.history, first), to: ENDED.has(worker.state) ? worker.stateSince : null };
}
