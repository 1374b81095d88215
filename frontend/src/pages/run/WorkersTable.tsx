// The Workers tab (seed: State, What it means, Machine, GPUs, Exit code and restarts), each
// worker linking to its page and its log. Machine and GPUs say where a worker is: the machine
// and the GPU ids it holds now, or, once it ended, those it last ran on (issue 36: an ended
// worker showed "—"); a worker not placed holds none and its GPUs cell says how many it asks
// for, marked so (the column mixed ids and counts: "2" read as GPU 2).
import { Head, StateBadge } from "../../components/Table";
import { ENDED } from "../../life";
import { Link } from "../../nav";
import { workerPath } from "../../routes";
import type { Run, Worker } from "./model";

// Where it is placed now, or ran last once it ended; null while it waits to be placed.
export function whereItIs(w: Worker): { machine: string; gpuIds: number[] } | null {
  if (w.machine) return { machine: w.machine, gpuIds: w.gpuIds };
  return ENDED.has(w.state) ? w.lastPlacement : null;
}

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
        {run.workers.map((w) => {
          const at = whereItIs(w);
          return (
            <tr key={w.name} data-row={w.name}>
              <th scope="row">
                <Link to={workerPath(org, workspace, run.cluster, w.name)}>{w.name}</Link>
                {w.straggler && <span className="badge">straggler</span>}
              </th>
              <td>
                <StateBadge state={w.state} />
              </td>
              <td className="wrap">{w.reason}</td>
              <td data-figure="machine" title={at && !w.machine ? "where it ran last" : undefined}>
                {at?.machine ?? "—"}
              </td>
              <td className="num" data-figure="gpus">
                <Gpus worker={w} ids={at?.gpuIds ?? null} />
              </td>
              <td className="num">{w.exitCode ?? "—"}</td>
              <td className="num">{w.restarts}</td>
              <td>
                <button type="button" className="small" onClick={() => onLog(w.name)} aria-label={`Log of ${w.name}`}>
                  Log
                </button>
              </td>
            </tr>
          );
        })}
      </tbody>
    </table>
  );
}

// The GPU ids it holds (or held), "none" for a worker without GPUs, else how many it asks for.
function Gpus({ worker, ids }: { worker: Worker; ids: number[] | null }) {
  if (worker.gpus === 0) return <span className="muted">none</span>;
  if (ids && ids.length > 0) return <>{ids.join(", ")}</>;
  return (
    <span className="muted" title="Not placed: the GPUs it asks for">
      {worker.gpus} asked
    </span>
  );
}
