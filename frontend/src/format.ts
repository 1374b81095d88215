// Figures as the seed prints them: GPU-hours to one decimal, goodput as a whole percent.

// GPU-hours to one decimal (323.1, 21.0, 0.0), or as many as two significant digits need below
// one (0.20, 0.030, 0.0022): one decimal read a small run as "HELD 0.2 USED 0.0 GOODPUT 15%",
// its figures not agreeing (issue 36). Zero is 0.0.
export function gpuHours(value: number): string {
  const digits = decimalsOf(value);
  return value.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
}

function decimalsOf(value: number): number {
  if (value === 0 || !Number.isFinite(value)) return 1;
  // the decade of the value as two significant digits round it (0.0996 is 0.10, not 0.100)
  const rounded = Number(Math.abs(value).toPrecision(2));
  return Math.max(1, 1 - Math.floor(Math.log10(rounded)));
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
function roundHalfEven(value: number): number {
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
