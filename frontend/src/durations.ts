// Durations as the run specification writes them (12h, 30m, 1h30m, 45s, 2d) and as the
// console shows them.

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
