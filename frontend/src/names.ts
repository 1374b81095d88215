// A worker is <run>-<rank>.
export function runOf(worker: string): string {
  const cut = worker.lastIndexOf("-");
  return cut > 0 ? worker.slice(0, cut) : worker;
}
