// The seed's categories of GPU time (goodput.txt), one colour each, the same on every page.
// Keyed by the schema's GoodputCategory (generated from schema.graphql, whose values are the
// accounting's own and the REST shim's keys): a category added to or renamed in the schema
// fails the type check here until it has its label and colour, instead of going unshown.
import type { GoodputCategory } from "./generated/graphql";

export interface CategoryStyle {
  category: GoodputCategory;
  label: string;
  colour: string;
  meaning: string;
}

// In the order a bar shows them: used first, then each loss while held, then waiting (an
// object's string keys keep the order they were written in).
const STYLES: Record<GoodputCategory, Omit<CategoryStyle, "category">> = {
  productive: { label: "Productive", colour: "#2f9e44", meaning: "running, GPUs busy" },
  idle: { label: "Idle", colour: "#868e96", meaning: "running, GPUs not busy" },
  stalled: { label: "Stalled", colour: "#f08c00", meaning: "running, no progress" },
  starting: { label: "Starting", colour: "#74c0fc", meaning: "placed, not yet running" },
  restart: { label: "Restart", colour: "#9c36b5", meaning: "starting again after a restart" },
  failure: { label: "Failure", colour: "#e03131", meaning: "held while failing" },
  preemption: { label: "Preemption", colour: "#a0522d", meaning: "held while preempted or drained" },
  waiting: { label: "Waiting", colour: "#dee2e6", meaning: "asked for, not yet held" },
};

export const CATEGORIES: CategoryStyle[] = (Object.keys(STYLES) as GoodputCategory[]).map((category) => ({
  category,
  ...STYLES[category],
}));

export const STYLE: Record<GoodputCategory, CategoryStyle> = Object.fromEntries(
  CATEGORIES.map((c) => [c.category, c]),
) as Record<GoodputCategory, CategoryStyle>;
