// A run's page (seed logs-metrics-debugging.txt): its state and sentence, who started it and
// when; the readout; the panel of what it does now (run/Panels: why it failed, preempted,
// restarting in a loop, why it does not start); its goodput and bar; Run again; tabs Workers,
// Logs, Metrics and History. Its parts are in run/. Its goodput over time (issue 23): hour by hour since it was submitted (the last
// 7 days at most), a click on an hour opening its intervals. How often to checkpoint (issue 41):
// its own query, under its rework, its sentence also a line of the Restarting in a loop panel.
import { useState } from "react";

import { GoodputOverTime } from "../components/GoodputOverTime";
import { StackedBar } from "../components/StackedBar";
import { StateBadge } from "../components/Table";
import { decimalsFor, percent, when } from "../format";
import type { RunQuery } from "../generated/graphql";
import { LEDGER_FIELDS } from "../ledger";
import { runLife } from "../life";
import { LogView } from "../logs/LogView";
import { Link, useNavigate } from "../nav";
import { runPath, runsPath, type RunTab } from "../routes";
import { useQuery } from "../useQuery";
import { EventLog } from "./EventsPage";
import { Intervals, Summary, type Picked } from "./Goodput";
import { Metrics } from "./LazyMetrics";
import { CheckpointAdvicePanel, useCheckpointAdvice } from "./run/CheckpointAdvice";
import { WORKER_FIELDS } from "./run/model";
import { Panels } from "./run/Panels";
import { Readout } from "./run/Readout";
import { Rework } from "./run/Rework";
import { RunAgain } from "./run/RunAgain";
import { SlurmJob } from "./run/SlurmJob";
import { WorkersTable } from "./run/WorkersTable";

const RUN_QUERY = /* GraphQL */ `query Run($name: String!, $ws: String) {
  run(name: $name, workspace: $ws) {
    name cluster state reason priority createdAt stateSince endedAt createdBy spec
    slurm { jobId submittedHere jobName account user partition qos priority cancelledBy }
    history { transitionAt state reason }
    pendingReasons { machine reason }
    goodput { ...LedgerFields }
    ettr
    rework { gpuHours redos { attempt restartedAt checkpointStep reachedStep stepsRedone until caughtUp gpuHours } }
    failedWorker { ...WorkerFields }
    advice { reason exitCode kind lookAt open }
    restartLoop { restarts maxRestarts restartAt worker { ...WorkerFields } }
    waitAdvice { reason exitCode kind lookAt open }
    workers { ...WorkerFields }
    idlePolicy { gpuUtilizationBelow window action }
    code { digest size files stored }
  }
}`;
const RUN = RUN_QUERY + WORKER_FIELDS + LEDGER_FIELDS;

const TABS: { tab: RunTab; label: string }[] = [
  { tab: "workers", label: "Workers" },
  { tab: "logs", label: "Logs" },
  { tab: "metrics", label: "Metrics" },
  { tab: "history", label: "History" },
];

// Since the run's hour, but no more than the last 7 days (the report's default period).
export function chartStart(createdAt: string, now = Date.now()): string {
  const hour = Math.floor(Date.parse(createdAt) / 3.6e6) * 3.6e6;
  return new Date(Math.max(hour, now - 7 * 24 * 3.6e6)).toISOString();
}

export function RunPage(props: { org: string; workspace: string; run: string; tab: RunTab; worker: string | null }) {
  const { org, workspace, run: name, tab, worker } = props;
  const go = useNavigate();
  const found = useQuery<RunQuery>(RUN, { name, ws: workspace }, true, 10_000);
  const [again, setAgain] = useState(false);
  const [hour, setHour] = useState<Picked | null>(null);
  const run = found.data?.run;
  // the panel under its rework asks the same: one request
  const checkpoint = useCheckpointAdvice(name, workspace, Boolean(run)).data?.checkpointAdvice ?? null;
  if (found.error) {
    return (
      <main className="page">
        <p className="error" role="alert">
          {found.error}
        </p>
      </main>
    );
  }
  if (!found.data) return <main className="page muted">Loading…</main>;
  if (!run) {
    return (
      <main className="page">
        <h1>{name}</h1>
        <p className="empty">
          No run named {name} in workspace {workspace}. <Link to={runsPath(org, workspace)}>See its runs</Link>.
        </p>
      </main>
    );
  }
  const logWorker = worker ?? run.failedWorker?.name ?? run.workers[0]?.name ?? "";
  // its GPU-hours' digits, as `astra astraeus goodput --run` prints them (format.ts decimalsFor)
  const decimals = decimalsFor([run.goodput.allocatedGpuHours]);
  const open = (next: RunTab, w?: string) => go(runPath(org, workspace, name, next, w));
  return (
    <main className="page" aria-labelledby="run-title">
      <header className="page-head">
        <div>
          <h1 id="run-title">
            {run.name} <StateBadge state={run.state} />
          </h1>
          <p className="sentence">{run.reason}</p>
          <p className="muted">
            Started by {run.createdBy ?? "someone"} at {when(run.createdAt)} · cluster {run.cluster}
          </p>
        </div>
        <button type="button" onClick={() => setAgain(true)}>
          Run again
        </button>
      </header>
      {again && <RunAgain run={run} onClose={() => setAgain(false)} onCreated={(n) => go(runPath(org, workspace, n))} />}
      <Readout run={run} />
      <SlurmJob job={run.slurm} />
      <Panels run={run} checkpoint={checkpoint} onLog={(w) => open("logs", w)} onMetrics={() => open("metrics")} />
      <section aria-label="Goodput of the run">
        <h2>Goodput</h2>
        <Summary total={run.goodput} decimals={decimals} />
        <p className="muted" data-figure="ettr" title="Effective training time ratio: its productive GPU time over its GPUs times its wall time since it was submitted">
          ETTR {percent(run.ettr)} <span>(productive time over its GPUs' wall time since it was submitted)</span>
        </p>
        <Rework rework={run.rework} productive={run.goodput.productiveGpuHours} decimals={decimals} />
        <CheckpointAdvicePanel run={name} workspace={workspace} />
        <StackedBar
          ledger={run.goodput}
          name={run.name}
          scale={run.goodput.allocatedGpuHours + run.goodput.waitingGpuHours}
          decimals={decimals}
        />
        <GoodputOverTime
          by="RUN"
          name={run.name}
          workspace={workspace}
          start={chartStart(run.createdAt)}
          title={`${run.name}, hour by hour`}
          onPoint={(p) => setHour({ by: "RUN", name: run.name, category: null, start: p.start, end: p.end })}
        />
        {hour && <Intervals workspace={workspace} {...hour} onClose={() => setHour(null)} />}
      </section>
      <div className="tabs tabs-wide" role="tablist" aria-label="Run">
        {TABS.map((t) => (
          <button key={t.tab} role="tab" aria-selected={tab === t.tab} onClick={() => open(t.tab, worker ?? undefined)}>
            {t.label}
          </button>
        ))}
      </div>
      <div role="tabpanel">
        {tab === "workers" && <WorkersTable org={org} workspace={workspace} run={run} onLog={(w) => open("logs", w)} />}
        {tab === "logs" && logWorker && (
          <LogView workers={run.workers.map((w) => w.name)} worker={logWorker} onWorker={(w) => open("logs", w)} />
        )}
        {tab === "metrics" && <Metrics match={[`run:${run.name}`]} by="worker" life={runLife(run)} />}
        {tab === "history" && <EventLog org={org} workspace={workspace} name={run.name} kind={null} label="History" />}
      </div>
    </main>
  );
}
