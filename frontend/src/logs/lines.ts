// A worker's log as the Logs tab keeps it: the last 5 000 lines, the error-like ones counted;
// what it shows after Find… and Errors only is what Download saves (seed L-8).

export const KEEP = 5000;

// The seed's error-like lines: error, exception, traceback, NCCL WARN, CUDA error, killed.
const ERROR_LIKE = /error|exception|traceback|NCCL WARN|CUDA error|killed/i;

export function isErrorLike(line: string): boolean {
  return ERROR_LIKE.test(line);
}

// Seed L-7: "Errors only keeps the lines containing error": of the error-like lines, those
// that say error (RuntimeError, CUDA error), not a bare "Traceback (most recent call last):",
// "Killed" or "NCCL WARN …".
export function isError(line: string): boolean {
  return /error/i.test(line);
}

// Lines appended to what was kept, the last KEEP of them; a chunk may end mid-line.
export function append(kept: string[], partial: string, text: string): { lines: string[]; partial: string } {
  const pieces = (partial + text).split("\n");
  const rest = pieces.pop() ?? "";
  const lines = pieces.length ? kept.concat(pieces) : kept;
  return { lines: lines.length > KEEP ? lines.slice(lines.length - KEEP) : lines, partial: rest };
}

export function shown(lines: string[], find: string, errorsOnly: boolean): string[] {
  const needle = find.trim().toLowerCase();
  return lines.filter(
    (line) => (!errorsOnly || isError(line)) && (!needle || line.toLowerCase().includes(needle)),
  );
}

// Download's file: the lines shown, one a line (seed L-8: "Download saves what is shown").
export function saved(lines: string[]): string {
  return lines.length ? lines.join("\n") + "\n" : "";
}
