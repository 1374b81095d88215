// The Workers tab (seed: State, What it means, Machine, GPUs, Exit code and restarts), each
// worker linking to its page and its log.
import { Head, StateBadge } from "../../components/Table";
import { Link } from "../../nav";
import { workerPath } from "../../routes";
import type { Run } from "./model";

export function WorkersTable({
  org,
  workspace,
  run,
  onLog,
}: {
  org: string;
  workspace: string;
  run: Run;
  onLog: (worker: string) => void;
}) {
  return (
    <table className="ledger" aria-label="Workers">
      <Head
        columns={[
          "Worker",
          "State",
          "What it means",
          "Machine",
          { label: "GPUs", num: true },
          { label: "Exit code", num: true },
          { label: "Restarts", num: true },
          { label: "Log", hidden: true },
        ]}
      />
      <tbody>
        {run.workers.map((w) => (
          <tr key={w.name} data-row={w.name}>
            <th scope="row">
              <Link to={workerPath(org, workspace, run.cluster, w.name)}>{w.name}</Link>
              {w.straggler && <span className="badge">straggler</span>}
            </th>
            <td>
              <StateBadge state={w.state} />
            </td>
            <td className="wrap">{w.reason}</td>
            <td>{w.machine ?? "—"}</td>
            <td className="num">{w.gpuIds.length ? w.gpuIds.join(", ") : w.gpus}</td>
            <td className="num">{w.exitCode ?? "—"}</td>
            <td className="num">{w.restarts}</td>
            <td>
              <button type="button" className="small" onClick={() => onLog(w.name)} aria-label={`Log of ${w.name}`}>
                Log
              </button>
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

