// Durations as the run specification writes them (12h, 30m, 1h30m, 45s, 2d) and as the
// console shows them.
import { roundHalfEven } from "./format";

const UNIT_MS: Record<string, number> = { d: 86_400_000, h: 3_600_000, m: 60_000, s: 1000 };

export function parseDuration(text: string | null | undefined): number | null {
  if (!text) return null;
  const parts = [...text.matchAll(/(\d+(?:\.\d+)?)([dhms])/g)];
  if (parts.length === 0 || parts.map((p) => p[0]).join("") !== text.replace(/\s+/g, "")) return null;
  return parts.reduce((ms, [, n, unit]) => ms + Number(n) * UNIT_MS[unit], 0);
}

export function formatDuration(ms: number): string {
  const seconds = Math.max(0, Math.round(ms / 1000));
  const d = Math.floor(seconds / 86_400);
  const h = Math.floor((seconds % 86_400) / 3600);
  const m = Math.floor((seconds % 3600) / 60);
  const s = seconds % 60;
  if (d) return `${d}d ${h}h`;
  if (h) return `${h}h ${m}m`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

// A duration in seconds as the server's sentences say it (backend/accounting/checkpoint_advice.py
// seconds_shown, lifecycle/sentences.py minutes_shown): "42 s" under a minute, else whole
// minutes as "12 min", "1 h 5 min", "2 d 3 h" (issue 41: the checkpoint advice's figures read
// as its sentence does). Python's round(), halves to even, so both say the same digit.
export function secondsShown(seconds: number): string {
  if (seconds < 9.95) return `${Math.max(0, seconds).toFixed(1)} s`;
  const whole = roundHalfEven(seconds);
  if (whole < 60) return `${whole} s`;
  const minutes = roundHalfEven(seconds / 60);
  const d = Math.floor(minutes / 1440);
  const h = Math.floor((minutes % 1440) / 60);
  const m = minutes % 60;
  const parts = [
    [d, "d"],
    [h, "h"],
    [m, "min"],
  ].filter(([n]) => n) as [number, string][];
  return parts.map(([n, unit]) => `${n} ${unit}`).join(" ") || "0 min";
}
