// Issue 23: the Grafana dashboard of deploy/grafana is checked against Grafana's own dashboard
// schema (@grafana/schema's Dashboard: `tsc --noEmit`, which `npm run build` runs, refuses a
// field of the wrong type or a panel without its grid position), and here for what a schema
// cannot say: panels that fit Grafana's 24 columns without overlapping, unique ids, and every
// query on the data source the provisioning file names. No Grafana installs here (none is in
// Debian's packages nor on PyPI or npm); tests/test_grafana.py checks its queries against the
// gauges Astraeus serves.
import type { Dashboard, Panel } from "@grafana/schema";
import { describe, expect, it } from "vitest";
import dashboard from "../../deploy/grafana/dashboards/astraeus.json";

const checked: Dashboard = dashboard;
const panels = (checked.panels ?? []) as Panel[];

describe("the Grafana dashboard", () => {
  it("lays its panels out on 24 columns without overlaps", () => {
    const cells = new Set<string>();
    for (const p of panels) {
      const g = p.gridPos!;
      expect(g.x + g.w).toBeLessThanOrEqual(24);
      for (let x = g.x; x < g.x + g.w; x++) {
        for (let y = g.y; y < g.y + g.h; y++) {
          const cell = `${x},${y}`;
          expect(cells.has(cell), `${p.title} overlaps at ${cell}`).toBe(false);
          cells.add(cell);
        }
      }
    }
  });

  it("gives each panel its own id and queries the provisioned data source", () => {
    expect(new Set(panels.map((p) => p.id)).size).toBe(panels.length);
    for (const p of panels) {
      expect(p.datasource?.uid).toBe("astraeus-prometheus");
      expect(p.targets?.length).toBeGreaterThan(0);
      for (const t of p.targets ?? []) expect((t.datasource as { uid?: string } | undefined)?.uid).toBe("astraeus-prometheus");
    }
  });
});
