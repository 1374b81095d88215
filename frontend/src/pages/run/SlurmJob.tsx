// A Slurm run's job (issue 38), under the readout: its id and whether Astraeus submitted it or
// imported it, partition, account, QOS, Slurm's own priority, the Slurm user, and who cancelled
// it when someone did. Nothing for a run on any other cluster.
import type { Run } from "./model";

function shown(text: string): string {
  return text === "" ? "—" : text;
}

export function SlurmJob({ job }: { job: Run["slurm"] }) {
  if (!job) return null;
  const facts: { figure: string; label: string; value: string; note?: string }[] = [
    {
      figure: "slurm-job",
      label: "Slurm job",
      value: job.jobId,
      note: job.submittedHere ? "submitted from Astraeus" : "imported from Slurm",
    },
    { figure: "slurm-partition", label: "Partition", value: shown(job.partition) },
    { figure: "slurm-account", label: "Account", value: shown(job.account) },
    { figure: "slurm-qos", label: "QOS", value: shown(job.qos) },
    { figure: "slurm-priority", label: "Priority", value: job.priority === null ? "—" : String(job.priority), note: "Slurm's own" },
    { figure: "slurm-user", label: "User", value: shown(job.user) },
  ];
  if (job.cancelledBy !== null) facts.push({ figure: "slurm-cancelled-by", label: "Cancelled by", value: job.cancelledBy });
  return (
    <section aria-label="Slurm">
      <dl className="summary readout" aria-label="Slurm job">
        {facts.map((f) => (
          <div key={f.figure}>
            <dt>{f.label}</dt>
            <dd data-figure={f.figure}>
              {f.value}
              {f.note && <span className="muted"> {f.note}</span>}
            </dd>
          </div>
        ))}
      </dl>
    </section>
  );
}
