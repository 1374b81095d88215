// The workspace's runs that have not ended (all with "Ended too"), each linking to its page.
import { useState } from "react";

import { when } from "../format";
import type { RunsQuery } from "../generated/graphql";
import { Link } from "../nav";
import { runPath } from "../routes";
import { useQuery } from "../useQuery";
import { Head, StateBadge } from "../components/Table";

const RUNS = /* GraphQL */ `query Runs($all: Boolean!, $ws: String) { runs(all: $all, workspace: $ws) {
  name state reason createdAt createdBy workers { state gpus } } }`;

export function RunsPage({ org, workspace }: { org: string; workspace: string }) {
  const [all, setAll] = useState(false);
  const found = useQuery<RunsQuery>(RUNS, { all, ws: workspace }, true, 10_000);
  return (
    <main className="page" aria-labelledby="runs-title">
      <header className="page-head">
        <h1 id="runs-title">Runs</h1>
        <label>
          <input type="checkbox" checked={all} onChange={(e) => setAll(e.target.checked)} /> Ended too
        </label>
      </header>
      {found.error && <p className="error" role="alert">{found.error}</p>}
      {found.data && found.data.runs.length === 0 && (
        <p className="empty">
          No runs {all ? "" : "going "}in {workspace}. Submit one with astra astraeus submit spec.json.
        </p>
      )}
      {found.data && found.data.runs.length > 0 && (
        <table className="ledger">
          <Head columns={["Run", "State", "Why", { label: "Workers", num: true }, { label: "GPUs", num: true }, "Submitted"]} />
          <tbody>
            {found.data.runs.map((r) => (
              <tr key={r.name} data-row={r.name}>
                <th scope="row">
                  <Link to={runPath(org, workspace, r.name)}>{r.name}</Link>
                </th>
                <td>
                  <StateBadge state={r.state} />
                </td>
                <td className="wrap">{r.reason}</td>
                <td className="num">{r.workers.length}</td>
                <td className="num">{r.workers.reduce((sum, w) => sum + w.gpus, 0)}</td>
                <td>
                  {when(r.createdAt)}
                  {r.createdBy ? ` by ${r.createdBy}` : ""}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </main>
  );
}
