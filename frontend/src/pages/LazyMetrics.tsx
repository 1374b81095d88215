// The Metrics tab's charts (uPlot) load when first opened, not with the console.
import { lazy, Suspense } from "react";

import type { Life } from "../life";

const Charts = lazy(() => import("./Metrics").then((m) => ({ default: m.Metrics })));

export function Metrics(props: { match: string[]; by: string; life?: Life }) {
  return (
    <Suspense fallback={<p className="muted">Loading the charts…</p>}>
      <Charts {...props} />
    </Suspense>
  );
}
