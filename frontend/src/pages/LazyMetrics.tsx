// The Metrics tab's charts (uPlot) load when first opened, not with the console.
import { lazy, Suspense } from "react";

const Charts = lazy(() => import("./Metrics").then((m) => ({ default: m.Metrics })));

export function Metrics(props: { match: string[]; by: string }) {
  return (
    <Suspense fallback={<p className="muted">Loading the charts…</p>}>
      <Charts {...props} />
    </Suspense>
  );
}
