// A worker's page, /o/<org>/w/<workspace>/workers/<cluster>/<worker> (seed L-27, L-28): its
// machine, GPU ids, what it asked for, restarts, exit code; How it was started; Log, Metrics
// (with a range) and History tabs.
import { useState } from "react";

import { memory, when } from "../format";
import { workerLife } from "../life";
import { visible } from "../logs/lines";
import { LogView } from "../logs/LogView";
import { runOf } from "../names";
import { Link } from "../nav";
import { runPath } from "../routes";
import { useQuery } from "../useQuery";
import { Metrics } from "./LazyMetrics";
import type { WorkerPageQuery } from "../generated/graphql";
import { History } from "./run/History";
import { lastFailureOf, specOf, WORKER_FIELDS } from "./run/model";
import { StateBadge } from "../components/Table";

const WORKER = /* GraphQL */ `query WorkerPage($run: String!, $ws: String) { run(name: $run, workspace: $ws) { name spec workers {
  ...WorkerFields
  started { image command user gpuIds restartPolicy timeLimit rank environment mounts }
  history { transitionAt state reason } } } }`;
const QUERY = WORKER + WORKER_FIELDS;

type Tab = "log" | "metrics" | "history";

// Its memory limit as the specification sets it: memory_bytes, or per_gpu.memory_bytes times its
// GPUs (backend/runs/spec.py memory_limit_bytes); in MiB below a GiB (issue 21).
export function memoryAsked(spec: Record<string, unknown>, gpus: number): string | null {
  const perGpu = (spec.per_gpu as { memory_bytes?: number } | null | undefined)?.memory_bytes;
  const bytes = spec.memory_bytes ? Number(spec.memory_bytes) : perGpu ? perGpu * gpus : null;
  return bytes ? memory(bytes) : null;
}

export function WorkerPage({ org, workspace, worker: name }: { org: string; workspace: string; worker: string }) {
  const run = runOf(name);
  const found = useQuery<WorkerPageQuery>(QUERY, { run, ws: workspace }, true, 10_000);
  const [tab, setTab] = useState<Tab>("log");
  if (found.error) return <main className="page error" role="alert">{found.error}</main>;
  if (!found.data) return <main className="page muted">Loading…</main>;
  const worker = found.data.run?.workers.find((w) => w.name === name);
  if (!found.data.run || !worker) {
    return (
      <main className="page">
        <h1>{name}</h1>
        <p className="empty">No worker named {name} in workspace {workspace}.</p>
      </main>
    );
  }
  const spec = specOf(found.data.run);
  const asked = [
    `${worker.gpus} GPU${worker.gpus === 1 ? "" : "s"}`,
    spec.cpu !== undefined ? `${String(spec.cpu)} ${Number(spec.cpu) === 1 ? "core" : "cores"}` : null,
    memoryAsked(spec, worker.gpus),
  ].filter(Boolean);
  const s = worker.started;
  // where it is placed, or where it ran last: an ended worker ran somewhere (issue 21)
  const placement = worker.lastPlacement;
  // JSON in the schema: the specification's variables and its drives
  const environment = (s.environment ?? {}) as Record<string, string>;
  const mounts = Array.isArray(s.mounts) ? s.mounts : [];
  return (
    <main className="page" aria-labelledby="worker-title">
      <header className="page-head">
        <div>
          <h1 id="worker-title">
            {worker.name} <StateBadge state={worker.state} />
          </h1>
          <p className="sentence">{worker.reason}</p>
          <p className="muted">
            Rank {worker.rank} of <Link to={runPath(org, workspace, run)}>{run}</Link> · since {when(worker.stateSince)}
          </p>
        </div>
      </header>
      <dl className="summary" aria-label="Worker">
        <div>
          <dt>Machine</dt>
          <dd data-figure="machine">{placement?.machine ?? "—"}</dd>
        </div>
        <div>
          <dt>GPU ids</dt>
          <dd data-figure="gpu-ids">{placement?.gpuIds.length ? placement.gpuIds.join(", ") : "—"}</dd>
        </div>
        <div>
          <dt>Asked for</dt>
          <dd data-figure="asked">{asked.join(", ")}</dd>
        </div>
        <div>
          <dt>Restarts</dt>
          <dd data-figure="restarts">{worker.restarts}</dd>
        </div>
        <div>
          <dt>Exit code</dt>
          <dd data-figure="exit-code">{worker.exitCode ?? "—"}</dd>
        </div>
      </dl>
      {worker.advice && (
        <section className="panel failure" aria-label="Its failure">
          <h2>Its failure: {worker.advice.reason}</h2>
          <p>Look at: {worker.advice.lookAt}</p>
          {lastFailureOf(worker)?.log_tail && <pre className="log">{visible(lastFailureOf(worker)?.log_tail ?? "")}</pre>}
        </section>
      )}
      <section className="panel" aria-label="How it was started">
        <h2>How it was started</h2>
        <dl className="facts">
          <dt>Image</dt>
          <dd>{s.image ?? "none (a process on the machine)"}</dd>
          <dt>Command</dt>
          <dd>
            <code>{(s.command ?? []).join(" ")}</code>
          </dd>
          <dt>User</dt>
          <dd>{s.user ?? "the agent's"}</dd>
          <dt>GPU ids</dt>
          <dd>{s.gpuIds.join(", ") || "—"}</dd>
          <dt>Restart policy</dt>
          <dd>{s.restartPolicy}</dd>
          <dt>Time limit</dt>
          <dd>{s.timeLimit ?? "none"}</dd>
          <dt>Rank</dt>
          <dd>{s.rank}</dd>
          <dt>Environment</dt>
          <dd>
            {Object.keys(environment).length === 0
              ? "—"
              : Object.entries(environment).map(([k, v]) => (
                  <div key={k}>
                    <code>
                      {k}={v}
                    </code>
                  </div>
                ))}
          </dd>
          <dt>Mounts</dt>
          <dd>{mounts.length === 0 ? "—" : <code>{JSON.stringify(mounts)}</code>}</dd>
        </dl>
      </section>
      <div className="tabs tabs-wide" role="tablist" aria-label="Worker">
        {(["log", "metrics", "history"] as Tab[]).map((t) => (
          <button key={t} role="tab" aria-selected={tab === t} onClick={() => setTab(t)}>
            {t === "log" ? "Log" : t === "metrics" ? "Metrics" : "History"}
          </button>
        ))}
      </div>
      <div role="tabpanel">
        {tab === "log" && <LogView workers={[worker.name]} worker={worker.name} onWorker={() => undefined} />}
        {tab === "metrics" && <Metrics match={[`worker:${worker.name}`]} by="worker" life={workerLife(worker)} />}
        {tab === "history" && <History entries={worker.history} />}
      </div>
    </main>
  );
}
