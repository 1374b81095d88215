// Figures as the seed prints them: GPU-hours to one decimal, goodput as a whole percent.

// Decimals of a view's GPU-hours, as the CLI's goodput table chooses them
// (backend/cli/astra/goodput.py decimals_for): the seed's one where the smallest figure held
// (above 0) is 10 GPU-hours or more; under that, as many as keep it to three significant digits,
// down to a GPU-second (0.000278), so that a small run does not read "HELD 0.2 USED 0.0 GOODPUT
// 15%" (issue 36). One count for a whole view (a summary and its rows): they stay comparable.
export const MAX_DECIMALS = 6;

export function decimalsFor(held: number[]): number {
  const above = held.filter((h) => h > 0);
  if (above.length === 0) return 1;
  const smallest = Math.min(...above);
  for (let d = 1; d < MAX_DECIMALS; d++) if (smallest >= 10 ** (2 - d)) return d;
  return MAX_DECIMALS;
}

// GPU-hours to `decimals` (decimalsFor), with the thousands grouped: 1,234.6; 0.030.
export function gpuHours(value: number, decimals = 1): string {
  return value.toLocaleString("en-US", { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
}

// A noun for a count: one worker, two workers (issue 36: the console said "1 workers").
export function plural(count: number, noun: string): string {
  return count === 1 ? noun : `${noun}s`;
}

export function counted(count: number, noun: string): string {
  return `${count.toLocaleString("en-US")} ${plural(count, noun)}`;
}

export function percent(ratio: number | null | undefined): string {
  return ratio === null || ratio === undefined ? "—" : `${Math.round(ratio * 100)}%`;
}

export function when(iso: string): string {
  const d = new Date(iso);
  return `${d.toISOString().slice(0, 10)} ${d.toISOString().slice(11, 19)} UTC`;
}

const MIB = 2 ** 20;
const GIB = 2 ** 30;

// Python's round(): halves to the even neighbour, so the console and the CLI agree to the digit.
export function roundHalfEven(value: number): number {
  const floor = Math.floor(value);
  const rest = value - floor;
  if (Math.abs(rest - 0.5) > 1e-9) return Math.round(value);
  return floor % 2 === 0 ? floor : floor + 1;
}

// Memory as a person writes it and as the CLI does (backend/scheduling/placement.py
// memory_text): whole MiB below a GiB (256 MiB, not 0 GiB), else GiB to one decimal, without it
// when whole (23.5 GiB, 80 GiB) (issue 21).
export function memory(bytes: number): string {
  if (bytes < GIB) return `${roundHalfEven(bytes / MIB)} MiB`;
  const tenths = roundHalfEven((bytes * 10) / GIB);
  return tenths % 10 === 0 ? `${tenths / 10} GiB` : `${(tenths / 10).toFixed(1)} GiB`;
}
