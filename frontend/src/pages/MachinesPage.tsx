// For the organisation's admins: every machine of its clusters with its pool, state and reason,
// GPUs and unhealthy ones, last heard from; and the pools.
import { memory, when } from "../format";
import type { ClusterLimitsQuery, MachinesQuery } from "../generated/graphql";
import { useQuery } from "../useQuery";
import { Head, StateBadge } from "../components/Table";
import { CostlyMachines } from "./CostlyMachines";

// Issue 21: a cluster's quotas (astra astraeus quota set) and alert thresholds (setThreshold),
// read back where its admins see its machines.
export const LIMITS = /* GraphQL */ `query ClusterLimits($c: String!) { quotas(cluster: $c) { workspace cluster gpus }
  thresholds(cluster: $c) { name value default updatedAt } }`;

export function ClusterLimits({ cluster }: { cluster: string }) {
  const found = useQuery<ClusterLimitsQuery>(LIMITS, { c: cluster }, true, 60_000);
  return (
    <section aria-label={`Quotas and alert thresholds of ${cluster}`}>
      <h2>Quotas and alert thresholds of {cluster}</h2>
      {found.error && <p className="error" role="alert">{found.error}</p>}
      {found.data && found.data.quotas.length === 0 && (
        <p className="empty">No workspace has a GPU quota on {cluster}: set one with astra astraeus quota set.</p>
      )}
      {found.data && found.data.quotas.length > 0 && (
        <table className="ledger" aria-label={`Quotas on ${cluster}`}>
          <Head columns={["Workspace", { label: "GPU quota", num: true }]} />
          <tbody>
            {found.data.quotas.map((q) => (
              <tr key={q.workspace} data-row={q.workspace}>
                <th scope="row">{q.workspace}</th>
                <td className="num">{q.gpus ?? "none"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {found.data && (
        <table className="ledger" aria-label={`Alert thresholds of ${cluster}`}>
          <Head columns={["Threshold", { label: "Value", num: true }, { label: "Default", num: true }, "Set"]} />
          <tbody>
            {found.data.thresholds.map((t) => (
              <tr key={t.name} data-row={t.name}>
                <th scope="row">{t.name}</th>
                <td className="num">{t.value}</td>
                <td className="num">{t.default}</td>
                <td>{t.updatedAt ? when(t.updatedAt) : "default"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

const QUERY = /* GraphQL */ `query Machines { machines { name cluster pool state reason cpuCores memoryBytes gpus unhealthyGpus lastSeenAt isolation isolationNotEnforced }
  pools { name cluster machines gpus unhealthyGpus } }`;

export function MachinesPage() {
  const found = useQuery<MachinesQuery>(QUERY, {}, true, 15_000);
  return (
    <main className="page" aria-labelledby="machines-title">
      <h1 id="machines-title">Machines</h1>
      {found.error && <p className="error" role="alert">{found.error}</p>}
      {found.data && found.data.machines.length === 0 && (
        <p className="empty">No machine has joined: start an agent with an agent token (astraeus token create --agent).</p>
      )}
      {found.data && found.data.machines.length > 0 && (
        <table className="ledger" aria-label="Machines">
          <Head columns={["Machine", "Cluster", "Pool", "State", "Why", { label: "GPUs", num: true }, { label: "Cores", num: true }, { label: "Memory", num: true }, "Last heard from"]} />
          <tbody>
            {found.data.machines.map((m) => (
              <tr key={`${m.cluster}/${m.name}`} data-row={m.name}>
                <th scope="row">{m.name}</th>
                <td>{m.cluster}</td>
                <td>{m.pool ?? "—"}</td>
                <td>
                  <StateBadge state={m.state} />
                </td>
                <td className="wrap">{m.reason}</td>
                <td className="num">
                  {m.gpus}
                  {m.unhealthyGpus > 0 && <span className="error"> ({m.unhealthyGpus} unhealthy)</span>}
                </td>
                <td className="num">{m.cpuCores}</td>
                <td className="num">{memory(m.memoryBytes)}</td>
                <td>{m.lastSeenAt ? when(m.lastSeenAt) : "never"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {found.data && <Unenforced machines={found.data.machines} />}
      {found.data && found.data.machines.length > 0 && <CostlyMachines />}
      {found.data && found.data.pools.length > 0 && (
        <>
          <h2>Pools</h2>
          <table className="ledger" aria-label="Pools">
            <Head columns={["Pool", "Cluster", { label: "Machines", num: true }, { label: "GPUs", num: true }, { label: "Unhealthy", num: true }]} />
            <tbody>
              {found.data.pools.map((p) => (
                <tr key={`${p.cluster}/${p.name}`}>
                  <th scope="row">{p.name}</th>
                  <td>{p.cluster}</td>
                  <td className="num">{p.machines}</td>
                  <td className="num">{p.gpus}</td>
                  <td className="num">{p.unhealthyGpus}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
      {found.data &&
        [...new Set(found.data.machines.map((m) => m.cluster))].sort().map((c) => <ClusterLimits key={c} cluster={c} />)}
    </main>
  );
}

// What a machine's workloads are not kept from (issue 37): its agent tries each part of the
// sandbox as it starts and says what the kernel gave; a machine that enforces every part is not
// listed (as `astra astraeus machines` prints it).
function Unenforced({ machines }: { machines: MachinesQuery["machines"] }) {
  const weak = machines.filter((m) => m.isolationNotEnforced.length > 0);
  if (weak.length === 0) return null;
  return (
    <section aria-labelledby="isolation-title">
      <h2 id="isolation-title">Workload isolation not enforced</h2>
      <ul>
        {weak.map((m) => (
          <li key={`${m.cluster}/${m.name}`} data-isolation={m.name}>
            <strong>{m.name}</strong>: {m.isolation}
          </li>
        ))}
      </ul>
    </section>
  );
}
