// A ledger of the API (GoodputLedger) split into the bar's segments.
import { CATEGORIES } from "./categories";
import { gpuHours, roundHalfEven } from "./format";
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

// A ledger's figures as a view prints them, to its decimals (format.ts decimalsFor): its held
// parts apportioned so that they add up to its held as printed, not productive its held less
// its productive as printed, waiting on its own: its summary, its row and its bar's segments
// say the same digits (issue 36), as the CLI's goodput rows add up (backend/cli/astra/goodput.py
// cells).
export interface Figures {
  held: string;
  productive: string;
  notProductive: string;
  waiting: string;
  // a held category's part; waiting's for "waiting"
  part: (category: GoodputCategory) => string;
}

const HELD_PARTS = CATEGORIES.map((c) => c.category).filter((c) => c !== "waiting");

export function figuresOf(ledger: Ledger, decimals: number): Figures {
  const held = new Map(ledger.gpuHours.map((c) => [c.category, c.heldGpuHours]));
  const parts = HELD_PARTS.map((c) => held.get(c) ?? 0);
  const units = apportioned(ledger.allocatedGpuHours, parts, decimals);
  const text = (value: number) => gpuHours(value, decimals);
  const waiting = text(ledger.waitingGpuHours);
  if (units === null) {
    return {
      held: text(ledger.allocatedGpuHours),
      productive: text(ledger.productiveGpuHours),
      notProductive: text(notProductive(ledger)),
      waiting,
      part: (c) => (c === "waiting" ? waiting : text(held.get(c) ?? 0)),
    };
  }
  const [whole, ...each] = units;
  const unit = (n: number) => gpuHours(n / 10 ** decimals, decimals);
  const productive = each[HELD_PARTS.indexOf("productive")];
  return {
    held: unit(whole),
    productive: unit(productive),
    notProductive: unit(whole - productive),
    waiting,
    part: (c) => (c === "waiting" ? waiting : unit(each[HELD_PARTS.indexOf(c)])),
  };
}

// The total and its parts in units of the last decimal, the parts adding up to the total (each
// rounded down, then one more to those with the largest remainders); null when the parts do not
// add up to the total in the first place (the seed's own example rows). The CLI's _apportioned.
export function apportioned(total: number, parts: number[], decimals: number): number[] | null {
  const sum = parts.reduce((a, b) => a + b, 0);
  if (Math.abs(sum - total) > 1e-9 * Math.max(1, Math.abs(total))) return null;
  const scale = 10 ** decimals;
  const scaled = parts.map((p) => p * scale);
  const units = scaled.map((s) => Math.floor(s + 1e-9));
  const whole = roundHalfEven(total * scale);
  const short = whole - units.reduce((a, b) => a + b, 0);
  if (short < 0 || short > parts.length) return null;
  const byRemainder = parts.map((_, i) => i).sort((a, b) => units[a] - scaled[a] - (units[b] - scaled[b]));
  for (const i of byRemainder.slice(0, short)) units[i] += 1;
  return [whole, ...units];
}
