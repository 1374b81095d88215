// Issue 23, cost: the GPU time held on priced pools over the page's period as money, by run or
// workspace (each interval's GPU-hours times its pool's price per GPU-hour, set by the
// organisation's admins). Nothing is shown while no pool has a price.
import type { GoodputCostQuery } from "../generated/graphql";
import { useQuery } from "../useQuery";
import { Head } from "../components/Table";

export const COST = /* GraphQL */ `query GoodputCost($by: CostScope!, $start: DateTime, $ws: String) {
  goodputCost(by: $by, start: $start, workspace: $ws) { currency
    rows { name held lost byCategory { category amount } }
    total { name held lost byCategory { category amount } } } }`;

type Row = GoodputCostQuery["goodputCost"]["total"];
const SHOWN = ["productive", "idle", "stalled", "failure"] as const;

function money(value: number, currency: string): string {
  return value.toLocaleString("en-US", { style: "currency", currency, minimumFractionDigits: 2, maximumFractionDigits: 2 });
}

function amount(row: Row, category: string): number {
  return row.byCategory.find((c) => c.category === category)?.amount ?? 0;
}

export function CostView({ by, start, workspace }: { by: "RUN" | "WORKSPACE"; start: string; workspace: string }) {
  const found = useQuery<GoodputCostQuery>(COST, { by, start, ws: workspace });
  const cost = found.data?.goodputCost;
  if (found.error) return <p className="error" role="alert">{found.error}</p>;
  if (!cost || cost.currency === null) return null;
  const currency = cost.currency;
  const line = (r: Row, total: boolean) => (
    <tr key={total ? "TOTAL" : r.name} data-row={total ? "TOTAL" : r.name}>
      <th scope="row">{total ? "Total" : r.name}</th>
      <td className="num" data-figure="held-cost">{money(r.held, currency)}</td>
      {SHOWN.map((c) => (
        <td key={c} className="num" data-figure={`${c}-cost`}>
          {money(amount(r, c), currency)}
        </td>
      ))}
      <td className="num" data-figure="lost-cost">{money(r.lost, currency)}</td>
    </tr>
  );
  return (
    <section aria-label="Cost">
      <h2>What it cost ({currency})</h2>
      <p className="muted">Each GPU-hour held on a priced pool at its pool's price; lost is all but productive.</p>
      <table className="ledger" aria-label="Cost">
        <Head columns={[by === "RUN" ? "Run" : "Workspace", { label: "Held", num: true }, { label: "Productive", num: true }, { label: "Idle", num: true }, { label: "Stalled", num: true }, { label: "Failure", num: true }, { label: "Lost", num: true }]} />
        <tbody>
          {cost.rows.map((r) => line(r, false))}
          {line(cost.total, true)}
        </tbody>
      </table>
    </section>
  );
}
