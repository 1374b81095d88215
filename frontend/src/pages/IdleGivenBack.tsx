// Issue 41, idle policies: what the workspace's policies did over the last 7 days (idleReport):
// the GPU-hours their stops gave back, the idle GPU-hours the stopped runs had held over their
// windows, and each stop and notice, newest first, its run linking to the run's page. With none,
// a sentence says so and how a run's spec asks for one.
import { Link } from "../nav";
import { Head } from "../components/Table";
import { counted, decimalsFor, gpuHours, when } from "../format";
import type { IdleReportQuery } from "../generated/graphql";
import { runPath } from "../routes";
import { useQuery } from "../useQuery";

export const IDLE_REPORT = /* GraphQL */ `query IdleReport($ws: String) {
  idleReport(days: 7, workspace: $ws) { since gpuHoursGivenBack idleGpuHoursFound runsStopped
    actions { run action at idleSince gpus reason gpuHoursGivenBack } } }`;

export function IdleGivenBack({ org, workspace }: { org: string; workspace: string }) {
  const found = useQuery<IdleReportQuery>(IDLE_REPORT, { ws: workspace });
  const report = found.data?.idleReport;
  if (found.error) return <p className="error" role="alert">{found.error}</p>;
  if (!report) return null;
  // one count of decimals for the figures and the rows, as the goodput tables have
  const decimals = decimalsFor([
    report.gpuHoursGivenBack,
    report.idleGpuHoursFound,
    ...report.actions.map((a) => a.gpuHoursGivenBack),
  ]);
  return (
    <section aria-label="Idle GPUs given back">
      <h2>Idle GPUs given back</h2>
      {report.actions.length === 0 ? (
        <p className="empty">
          No idle policy stopped a run in the last 7 days: a run's spec may say{" "}
          <code>idle: {'{gpu_utilization_below: 5, for: "30m"}'}</code> to be stopped when every GPU it holds stays
          under 5% for 30 minutes.
        </p>
      ) : (
        <>
          <p className="muted">
            Over the last 7 days (since {when(report.since)}): the runs the idle policies stopped and the GPU time that
            gave back, and the workspace's notices.
          </p>
          <dl className="summary">
            <div>
              <dt>GPU-hours given back</dt>
              <dd data-figure="given-back">{gpuHours(report.gpuHoursGivenBack, decimals)} GPU-h</dd>
            </div>
            <div>
              <dt>Idle GPU-hours found</dt>
              <dd data-figure="idle-found">
                {gpuHours(report.idleGpuHoursFound, decimals)} GPU-h
                <span className="muted">held idle by the stopped runs over their windows</span>
              </dd>
            </div>
            <div>
              <dt>Runs stopped</dt>
              <dd data-figure="runs-stopped">{counted(report.runsStopped, "run")}</dd>
            </div>
          </dl>
          <table className="ledger" aria-label="Idle actions">
            <Head
              columns={["Run", "What", "When", { label: "GPUs", num: true }, { label: "GPU-hours given back", num: true }]}
            />
            <tbody>
              {report.actions.map((a) => (
                <tr key={`${a.run}-${a.action}-${a.at}`} data-row={a.run}>
                  <th scope="row">
                    <Link to={runPath(org, workspace, a.run)}>{a.run}</Link>
                  </th>
                  <td data-figure="reason">{a.reason}</td>
                  <td data-figure="at" title={`Idle since ${when(a.idleSince)}`}>
                    {when(a.at)}
                  </td>
                  <td className="num" data-figure="gpus">
                    {a.gpus}
                  </td>
                  <td className="num" data-figure="given-back">
                    {a.action === "stop" ? gpuHours(a.gpuHoursGivenBack, decimals) : "—"}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}
