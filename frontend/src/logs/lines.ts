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

// Issue 37 N7: the log is what the workload wrote, control characters included. The page does
// not obey a terminal's escape sequences, but as text they draw nothing or a box (by browser
// and font), so a line says other than what was written, and a bidi override (U+202E) shows
// "invoice\u202efdp.exe" as "invoiceexe.pdf". Each is shown instead, as astra shows it:
// a C0 control or DEL as its Unicode control picture (ESC as ␛, \r as ␍), a C1 or bidi
// control as <U+XXXX>; tabs and newlines stay. Per character, so a chunk may end anywhere.
const UNSAFE = /[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

export function visible(text: string): string {
  return text.replace(UNSAFE, (c) => {
    const code = c.charCodeAt(0);
    if (code < 0x20) return String.fromCharCode(0x2400 + code);
    if (code === 0x7f) return "\u2421";
    return `<U+${code.toString(16).toUpperCase().padStart(4, "0")}>`;
  });
}

// Lines appended to what was kept, the last KEEP of them; a chunk may end mid-line. They are
// kept as shown (visible): Find…, Errors only and Download work on what the page shows.
export function append(kept: string[], partial: string, text: string): { lines: string[]; partial: string } {
  const pieces = (partial + visible(text)).split("\n");
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
