// A worker's log as the Logs tab keeps it: the last 5 000 lines, the error-like ones counted.

export const KEEP = 5000;

// The seed's error-like lines: error, exception, traceback, NCCL WARN, CUDA error, killed.
const ERROR_LIKE = /error|exception|traceback|NCCL WARN|CUDA error|killed/i;

export function isErrorLike(line: string): boolean {
  return ERROR_LIKE.test(line);
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
    (line) => (!errorsOnly || isErrorLike(line)) && (!needle || line.toLowerCase().includes(needle)),
  );
}
