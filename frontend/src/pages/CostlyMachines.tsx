// Issue 23, lemon machines: the organisation's machines ranked by the GPU time lost on them over
// the last 7 days (failure, restart and stalled, held there), with their workers' failures by
// kind, their GPU faults, how that compares with their pool and the suggested action. Only the
// machines with something to show are listed; the ranking is backend/machines/health.py's.
import type { MachineHealthQuery } from "../generated/graphql";
import { decimalsFor, gpuHours } from "../format";
import { useQuery } from "../useQuery";
import { Head } from "../components/Table";

export const HEALTH = /* GraphQL */ `query MachineHealth { machineHealth { machines {
  machine cluster pool lostGpuHours failureCount failures { kind count } faultCount lastFault
  unhealthyGpus vsPool action } } }`;

export function CostlyMachines() {
  const found = useQuery<MachineHealthQuery>(HEALTH, {}, true, 60_000);
  const rows = found.data?.machineHealth.machines.filter((m) => m.action !== "none") ?? [];
  const decimals = decimalsFor(rows.map((m) => m.lostGpuHours));
  return (
    <section aria-label="Costly machines">
      <h2>Costly machines</h2>
      <p className="muted">
        The last 7 days, worst first: GPU-hours held in failure, restart and stalled on each machine, the failures of its workers (not a rank
        that died of a lost peer), its GPU faults, and its failures over the median of its pool's other machines.
      </p>
      {found.error && <p className="error" role="alert">{found.error}</p>}
      {found.data && rows.length === 0 && <p className="empty">No machine lost GPU time, failed a worker or faulted in the last 7 days.</p>}
      {rows.length > 0 && (
        <table className="ledger" aria-label="Costly machines">
          <Head columns={["Machine", "Pool", { label: "Lost GPU-hours", num: true }, "Failures", "GPU faults", { label: "Vs pool", num: true }, "Suggested action"]} />
          <tbody>
            {rows.map((m) => (
              <tr key={`${m.cluster}/${m.machine}`} data-row={m.machine}>
                <th scope="row">{m.machine}</th>
                <td>{m.pool ?? "—"}</td>
                <td className="num" data-figure="lost">{gpuHours(m.lostGpuHours, decimals)}</td>
                <td data-figure="failures">
                  {m.failureCount}
                  {m.failures.length > 0 && ` (${m.failures.map((f) => `${f.kind} ${f.count}`).join(", ")})`}
                </td>
                <td data-figure="faults" title={m.lastFault ?? undefined}>
                  {m.faultCount}
                  {m.unhealthyGpus > 0 && <span className="error"> ({m.unhealthyGpus} unhealthy now)</span>}
                </td>
                <td className="num">{m.vsPool === null ? "—" : `${m.vsPool.toFixed(1)}×`}</td>
                <td className="wrap" data-figure="action">{m.action}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
