// Every GPU the workspace may use (seed L-39): machine and index, model, utilisation now,
// health and which run holds it.
import { counted, memory } from "../format";
import type { GpusQuery } from "../generated/graphql";
import { Link } from "../nav";
import { runPath } from "../routes";
import { useQuery } from "../useQuery";
import { Head } from "../components/Table";

const GPUS = /* GraphQL */ `query Gpus($ws: String) { gpus(workspace: $ws) {
  machine index model memoryBytes health healthReason utilization heldBy heldElsewhere } }`;

export function GpusPage({ org, workspace }: { org: string; workspace: string }) {
  const found = useQuery<GpusQuery>(GPUS, { ws: workspace }, true, 15_000);
  const gpus = found.data?.gpus ?? [];
  const free = gpus.filter((g) => !g.heldBy && !g.heldElsewhere).length;
  return (
    <main className="page" aria-labelledby="gpus-title">
      <header className="page-head">
        <h1 id="gpus-title">GPUs</h1>
        {found.data && (
          <span className="muted">
            {counted(gpus.length, "GPU")}, {free} free
          </span>
        )}
      </header>
      {found.error && <p className="error" role="alert">{found.error}</p>}
      {found.data && gpus.length === 0 && (
        <p className="empty">No machine has joined yet: start an agent with astraeus agent (astraeus up starts one here).</p>
      )}
      {gpus.length > 0 && (
        <table className="ledger">
          <Head columns={["GPU", "Model", { label: "Memory", num: true }, "Utilisation", "Health", "Held by"]} />
          <tbody>
            {gpus.map((g) => {
              const id = `${g.machine}/${g.index}`;
              const use = g.utilization === null ? null : Math.round(g.utilization * 100);
              return (
                <tr key={id} data-row={id}>
                  <th scope="row">{id}</th>
                  <td>{g.model}</td>
                  <td className="num">{memory(g.memoryBytes)}</td>
                  <td data-figure="utilization">
                    {use === null ? (
                      "—"
                    ) : (
                      <span className="meter" title={`${use}%`}>
                        <span style={{ width: `${use}%` }} />
                        <em>{use}%</em>
                      </span>
                    )}
                  </td>
                  <td className={g.health === "ok" ? "" : "error"} title={g.healthReason}>
                    {g.health}
                    {g.health !== "ok" && g.healthReason ? `: ${g.healthReason}` : ""}
                  </td>
                  <td data-figure="holder">
                    {g.heldBy ? (
                      <Link to={runPath(org, workspace, g.heldBy)}>{g.heldBy}</Link>
                    ) : g.heldElsewhere ? (
                      <span className="muted">another workspace</span>
                    ) : (
                      <span className="muted">free</span>
                    )}
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
    </main>
  );
}
