// The seed's categories of GPU time (goodput.txt), one colour each, the same on every page.

export type Category =
  | "productive"
  | "idle"
  | "stalled"
  | "starting"
  | "restart"
  | "failure"
  | "preemption"
  | "waiting";

export interface CategoryStyle {
  category: Category;
  label: string;
  colour: string;
  meaning: string;
}

// In the order a bar shows them: used first, then each loss while held, then waiting.
export const CATEGORIES: CategoryStyle[] = [
  { category: "productive", label: "Productive", colour: "#2f9e44", meaning: "running, GPUs busy" },
  { category: "idle", label: "Idle", colour: "#868e96", meaning: "running, GPUs not busy" },
  { category: "stalled", label: "Stalled", colour: "#f08c00", meaning: "running, no progress" },
  { category: "starting", label: "Starting", colour: "#74c0fc", meaning: "placed, not yet running" },
  { category: "restart", label: "Restart", colour: "#9c36b5", meaning: "starting again after a restart" },
  { category: "failure", label: "Failure", colour: "#e03131", meaning: "held while failing" },
  { category: "preemption", label: "Preemption", colour: "#a0522d", meaning: "held while preempted or drained" },
  { category: "waiting", label: "Waiting", colour: "#dee2e6", meaning: "asked for, not yet held" },
];

export const STYLE: Record<Category, CategoryStyle> = Object.fromEntries(
  CATEGORIES.map((c) => [c.category, c]),
) as Record<Category, CategoryStyle>;
