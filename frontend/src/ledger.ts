// A ledger of the API (GoodputLedger) split into the bar's segments.
import { CATEGORIES } from "./categories";
import type { GoodputCategory, LedgerFieldsFragment } from "./generated/graphql";

// Its type is generated from schema.graphql and this fragment (npm run codegen).
export type Ledger = LedgerFieldsFragment;
export type CategoryTime = Ledger["gpuHours"][number];

// A document that spreads ...LedgerFields appends this once.
export const LEDGER_FIELDS = /* GraphQL */ `
  fragment LedgerFields on GoodputLedger {
    allocatedGpuHours productiveGpuHours lostGpuHours waitingGpuHours goodput
    gpuHours { category gpuHours heldGpuHours } biggestLoss { category gpuHours heldGpuHours }
  }`;

export interface Segment {
  category: GoodputCategory;
  gpuHours: number;
  share: number; // of all the time asked for (held and waiting), 0 to 1
}

// Where the time went: each category's held part, then all the time not held as waiting.
export function segments(ledger: Ledger): Segment[] {
  const held = new Map(ledger.gpuHours.map((c) => [c.category, c.heldGpuHours]));
  const asked = ledger.allocatedGpuHours + ledger.waitingGpuHours;
  return CATEGORIES.map(({ category }) => {
    const hours = category === "waiting" ? ledger.waitingGpuHours : (held.get(category) ?? 0);
    return { category, gpuHours: hours, share: asked > 0 ? hours / asked : 0 };
  }).filter((s) => s.gpuHours > 0);
}

// Held, not productive: every held category but productive.
export function notProductive(ledger: Ledger): number {
  return ledger.allocatedGpuHours - ledger.productiveGpuHours;
}

// The biggest part of "not productive": the held category other than productive with the most
// time (the API's biggestLoss also weighs time not held, which the page shows as waiting).
export function biggestHeldLoss(ledger: Ledger): CategoryTime | null {
  const losses = ledger.gpuHours.filter((c) => c.category !== "productive" && c.heldGpuHours > 0);
  return losses.reduce<CategoryTime | null>((best, c) => (best && best.heldGpuHours >= c.heldGpuHours ? best : c), null);
}
