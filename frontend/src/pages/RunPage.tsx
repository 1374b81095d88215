// A run's page (seed logs-metrics-debugging.txt): its state and sentence, who started it and
// when; the readout; its goodput and bar; the failure panel with the seed's advice and Its log;
// the Restarting in a loop panel; Run again; tabs Workers, Logs, Metrics and History.
import { useState } from "react";

import { graphql } from "../api";
import { StackedBar } from "../components/StackedBar";
import { formatDuration, parseDuration } from "../durations";
import { memory as bytesOf, when } from "../format";
import type { CreateRunMutation, RunQuery, WorkerFieldsFragment } from "../generated/graphql";
import { LEDGER_FIELDS } from "../ledger";
import { runLife } from "../life";
import { LogView } from "../logs/LogView";
import { Link, useNavigate } from "../nav";
import { runPath, runsPath, workerPath, type RunTab } from "../routes";
import { useQuery, useRest } from "../useQuery";
import { EventLog } from "./EventsPage";
import { Metrics } from "./LazyMetrics";
import { Summary } from "./Goodput";
import { Head, Sentences, StateBadge } from "../components/Table";

// The result types are generated from schema.graphql and these documents (npm run codegen).
export type Worker = WorkerFieldsFragment;
export type Run = NonNullable<RunQuery["run"]>;
type RestartLoop = NonNullable<Run["restartLoop"]>;
type HistoryEntry = Run["history"][number];

// The failure snapshot (JSON in the schema) as the agent writes it.
export interface LastFailure {
  reason?: string;
  failed_at?: string;
  exit_code?: number | null;
  log_tail?: string | null;
}

export function lastFailureOf(worker: { lastFailure: unknown } | null | undefined): LastFailure | null {
  const found = worker?.lastFailure;
  return found && typeof found === "object" ? (found as LastFailure) : null;
}

// The stored specification (JSON in the schema): its keys as the run specification names them.
export function specOf(run: { spec: unknown }): Record<string, unknown> {
  return run.spec && typeof run.spec === "object" ? (run.spec as Record<string, unknown>) : {};
}

// A document that spreads ...WorkerFields appends this once.
export const WORKER_FIELDS = /* GraphQL */ `
  fragment WorkerFields on Worker {
    name rank state reason stateSince gpus gpuIds restarts restartAt exitCode lastFailure
    machine straggler advice { reason exitCode kind lookAt open }
  }`;
const RUN_QUERY = /* GraphQL */ `query Run($name: String!, $ws: String) {
  run(name: $name, workspace: $ws) {
    name cluster state reason priority createdAt stateSince endedAt createdBy spec
    history { transitionAt state reason }
    pendingReasons { machine reason }
    goodput { ...LedgerFields }
    failedWorker { ...WorkerFields }
    advice { reason exitCode kind lookAt open }
    restartLoop { restarts maxRestarts restartAt worker { ...WorkerFields } }
    waitAdvice { reason exitCode kind lookAt open }
    workers { ...WorkerFields }
  }
}`;
const RUN = RUN_QUERY + WORKER_FIELDS + LEDGER_FIELDS;

const TABS: { tab: RunTab; label: string }[] = [
  { tab: "workers", label: "Workers" },
  { tab: "logs", label: "Logs" },
  { tab: "metrics", label: "Metrics" },
  { tab: "history", label: "History" },
];

export function RunPage(props: { org: string; workspace: string; run: string; tab: RunTab; worker: string | null }) {
  const { org, workspace, run: name, tab, worker } = props;
  const go = useNavigate();
  const found = useQuery<RunQuery>(RUN, { name, ws: workspace }, true, 10_000);
  const [again, setAgain] = useState(false);
  const run = found.data?.run;
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
      {run.state === "Failed" && (run.failedWorker || run.advice) && (
        <FailurePanel run={run} worker={run.failedWorker} onLog={(w) => open("logs", w)} onMemory={() => open("metrics")} />
      )}
      {run.state !== "Failed" && run.advice?.kind === "preempted" && (
        <section className="panel preempted" aria-label="Why it was stopped">
          <h2>Preempted</h2>
          <p className="sentence">{run.reason}</p>
          <p>
            <strong>Look at:</strong> <span data-figure="advice">{run.advice.lookAt}</span>
          </p>
        </section>
      )}
      {run.restartLoop && <RestartLoopPanel loop={run.restartLoop} onLog={(w) => open("logs", w)} onMetrics={() => open("metrics")} />}
      {run.waitAdvice && !(run.waitAdvice.kind === "restart_loop" && run.restartLoop) && (
        <section className="panel waiting" aria-label="Why it waits">
          <h2>Why it does not start</h2>
          <p className="sentence">{run.waitAdvice.reason}</p>
          <p>
            <strong>Look at:</strong> <span data-figure="wait-advice">{run.waitAdvice.lookAt}</span>
          </p>
          {run.waitAdvice.open === "machines" && run.pendingReasons.length > 0 && (
            <Sentences label="Per machine" items={run.pendingReasons.map((r) => ({ name: r.machine, sentence: r.reason }))} />
          )}
          {run.waitAdvice.open === "workers" && (
            <Sentences label="Its gang" items={run.workers.map((w) => ({ name: w.name, sentence: w.reason }))} />
          )}
        </section>
      )}
      <section aria-label="Goodput of the run">
        <h2>Goodput</h2>
        <Summary total={run.goodput} />
        <StackedBar ledger={run.goodput} name={run.name} scale={run.goodput.allocatedGpuHours + run.goodput.waitingGpuHours} />
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

interface TaskMetrics {
  tasks: { name: string; metrics: Record<string, number | Record<string, number>> }[];
}

function values(metric: number | Record<string, number> | undefined): number[] {
  if (metric === undefined) return [];
  return typeof metric === "number" ? [metric] : Object.values(metric);
}

// Workers running of total, GPUs, Machines, Time left or Runtime, Using now (GPU %, cores,
// memory), Priority with how it starts and fails.
function Readout({ run }: { run: Run }) {
  // its workers' latest samples, every 15 s while it runs
  const now = useRest<TaskMetrics>(`/tasks?job=${encodeURIComponent(run.name)}`, run.state === "Running", 15_000).data;
  const running = run.workers.filter((w) => w.state === "Running").length;
  const gpus = run.workers.reduce((sum, w) => sum + w.gpus, 0);
  const machines = new Set(run.workers.map((w) => w.machine).filter(Boolean)).size;
  const firstRunning = run.history.find((h) => h.state === "Running")?.transitionAt;
  const ended = run.endedAt ? new Date(run.endedAt).getTime() : Date.now();
  const runtime = firstRunning ? ended - new Date(firstRunning).getTime() : null;
  const spec = specOf(run);
  const limit = parseDuration(spec.time_limit as string | undefined);
  const clock =
    limit !== null && runtime !== null && !run.endedAt
      ? { label: "Time left", value: formatDuration(limit - runtime) }
      : { label: "Runtime", value: runtime === null ? "—" : formatDuration(runtime) };
  const tasks = now?.tasks ?? [];
  const utilisation = tasks.flatMap((t) => values(t.metrics.task_gpu_utilization_ratio));
  const gpuPercent = utilisation.length ? `${Math.round((utilisation.reduce((a, b) => a + b, 0) / utilisation.length) * 100)}%` : "—";
  const cores = tasks.flatMap((t) => values(t.metrics.task_cpu_usage_cores)).reduce((a, b) => a + b, 0);
  const memory = tasks.flatMap((t) => values(t.metrics.task_memory_used_bytes)).reduce((a, b) => a + b, 0);
  const restartPolicy = (spec.restart_policy as string | undefined) ?? "on_failure";
  const maxRestarts = (spec.max_restarts as number | undefined) ?? 10;
  const fails =
    restartPolicy === "never" ? "a failure ends it" : `restarts on failure, up to ${maxRestarts} in a row`;
  const starts = run.workers.length > 1 ? `${run.workers.length} workers start together` : "starts alone";
  return (
    <dl className="summary readout" aria-label="Readout">
      <div>
        <dt>Workers running</dt>
        <dd data-figure="workers">
          {running} of {run.workers.length}
        </dd>
      </div>
      <div>
        <dt>GPUs</dt>
        <dd data-figure="gpus">{gpus}</dd>
      </div>
      <div>
        <dt>Machines</dt>
        <dd data-figure="machines">{machines}</dd>
      </div>
      <div>
        <dt>{clock.label}</dt>
        <dd data-figure="clock">{clock.value}</dd>
      </div>
      <div>
        <dt>Using now</dt>
        <dd data-figure="using">
          {run.state === "Running" && tasks.some((t) => Object.keys(t.metrics).length > 0)
            ? `${gpuPercent} GPU · ${cores.toFixed(1)} cores · ${bytesOf(memory)}`
            : "—"}
        </dd>
      </div>
      <div>
        <dt>Priority</dt>
        <dd data-figure="priority">
          {run.priority}
          <span className="muted">
            {" "}
            {starts}; {fails}
          </span>
        </dd>
      </div>
    </dl>
  );
}

function FailurePanel({
  run,
  worker,
  onLog,
  onMemory,
}: {
  run: Run;
  worker: Worker | null;
  onLog: (worker: string) => void;
  onMemory: () => void;
}) {
  // The run's own advice (its time limit, its retry budget, …), else its failed worker's.
  const advice = run.advice ?? worker?.advice ?? null;
  const failure = lastFailureOf(worker);
  const tail = failure?.log_tail;
  return (
    <section className="panel failure" aria-label="Why it failed">
      <h2>Why it failed</h2>
      <p className="sentence">{run.reason}</p>
      {advice && (
        <p>
          <strong>Look at:</strong> <span data-figure="advice">{advice.lookAt}</span>
        </p>
      )}
      {worker && failure?.reason && failure.reason !== run.reason && (
        <p data-figure="last-failure">
          Its last failure: {worker.name}: {failure.reason}
          {failure.failed_at ? ` at ${when(failure.failed_at)}` : ""}.
        </p>
      )}
      <div className="actions">
        {worker && (
          <button type="button" onClick={() => onLog(worker.name)}>
            Its log
          </button>
        )}
        {(advice?.open === "memory" || advice?.open === "metrics") && (
          <button type="button" onClick={onMemory}>
            {advice.open === "memory" ? "Memory chart" : "Metrics"}
          </button>
        )}
      </div>
      {tail && (
        <details>
          <summary>The last lines it wrote before it failed</summary>
          <pre className="log">{tail}</pre>
        </details>
      )}
    </section>
  );
}

// A run restarting after failures or stalls in a row (seed: Restarting in a loop): its restarts,
// when the next attempt is, and the last failure's advice and output.
function RestartLoopPanel({
  loop,
  onLog,
  onMetrics,
}: {
  loop: RestartLoop;
  onLog: (worker: string) => void;
  onMetrics: () => void;
}) {
  const w = loop.worker;
  const failure = lastFailureOf(w);
  return (
    <section className="panel restarting" aria-label="Restarting in a loop">
      <h2>Restarting in a loop</h2>
      <p>
        <span data-figure="restarts">
          {loop.restarts} of {loop.maxRestarts}
        </span>{" "}
        restarts in a row;{" "}
        {loop.restartAt ? <>next attempt at {when(loop.restartAt)}</> : <>started again</>}.
      </p>
      <p className="muted">
        Each failure doubles the wait, up to 5 minutes; after 10 restarts in a row it gives up; 10 minutes running
        resets the count.
      </p>
      {w && failure && (
        <div>
          <p>
            The last failure: <strong>{w.name}</strong>: <span data-figure="loop-reason">{failure.reason}</span>
            {failure.failed_at ? ` at ${when(failure.failed_at)}` : ""}.
          </p>
          {w.advice && (
            <p>
              <strong>Look at:</strong> <span data-figure="loop-advice">{w.advice.lookAt}</span>
            </p>
          )}
          <div className="actions">
            <button type="button" onClick={() => onLog(w.name)}>
              Its log
            </button>
            {w.advice?.open === "metrics" && (
              <button type="button" onClick={onMetrics}>
                Metrics
              </button>
            )}
          </div>
          {failure.log_tail && <pre className="log">{failure.log_tail}</pre>}
        </div>
      )}
    </section>
  );
}

function WorkersTable({
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

// A worker's own transitions, newest first as the API gives them (seed L-43).
export function History({ entries }: { entries: HistoryEntry[] }) {
  const rows = entries;
  return (
    <table className="ledger" aria-label="History">
      <Head columns={["When", "State", "Why"]} />
      <tbody>
        {rows.map((h, i) => (
          <tr key={`${h.transitionAt}-${i}`}>
            <td>{when(h.transitionAt)}</td>
            <td>
              <StateBadge state={h.state} />
            </td>
            <td className="wrap">{h.reason}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

const CREATE = /* GraphQL */ `mutation CreateRun($spec: JSON!) { createRun(spec: $spec) { run { name } errors { code field message } } }`;

// Run again: the specification as JSON under a new name, edited, then submitted.
function RunAgain({ run, onClose, onCreated }: { run: Run; onClose: () => void; onCreated: (name: string) => void }) {
  const [text, setText] = useState(() => JSON.stringify({ ...specOf(run), name: `${run.name}-2` }, null, 2));
  const [errors, setErrors] = useState<string[]>([]);
  const submit = async () => {
    let spec: unknown;
    try {
      spec = JSON.parse(text);
    } catch (err) {
      setErrors([`The specification is not JSON: ${(err as Error).message}`]);
      return;
    }
    try {
      const { createRun } = await graphql<CreateRunMutation>(CREATE, { spec });
      if (createRun.errors.length) setErrors(createRun.errors.map((e) => `${e.field ?? "spec"}: ${e.message}`));
      else if (createRun.run) onCreated(createRun.run.name);
    } catch (err) {
      setErrors([(err as Error).message]);
    }
  };
  return (
    <section className="panel" role="dialog" aria-label="Run again">
      <h2>Run again</h2>
      <p className="muted">Its specification as JSON, under a new name: change what you need, then submit.</p>
      <textarea aria-label="Specification" value={text} onChange={(e) => setText(e.target.value)} rows={14} spellCheck={false} />
      {errors.length > 0 && (
        <ul className="error" role="alert">
          {errors.map((e) => (
            <li key={e}>{e}</li>
          ))}
        </ul>
      )}
      <div className="actions">
        <button type="button" onClick={submit}>
          Submit
        </button>
        <button type="button" onClick={onClose}>
          Cancel
        </button>
      </div>
    </section>
  );
}
