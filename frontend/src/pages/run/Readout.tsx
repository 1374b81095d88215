// The run's readout (seed: Workers running of total, GPUs, Machines, Time left or Runtime, Using
// now, Priority with how it starts and fails; its code and its idle policy where it has them,
// issue 41).
import { formatDuration, parseDuration } from "../../durations";
import { memory as bytesOf } from "../../format";
import { useRest } from "../../useQuery";
import { specOf, type Run } from "./model";

type IdlePolicy = NonNullable<Run["idlePolicy"]>;
type Code = NonNullable<Run["code"]>;

// The code a run ships with (--workdir): "sha256:6921375a022f… · 6 files, 12.0 KiB", or, past
// its retention, that it is no longer stored.
export function codeText(code: Code): string {
  const digest = `${code.digest.slice(0, 19)}…`;
  if (!code.stored || code.size === null) return `${digest} · no longer stored: submit it again with --workdir`;
  const files = code.files === 1 ? "1 file" : `${code.files} files`;
  const size = code.size < 2 ** 20 ? `${(code.size / 1024).toFixed(1)} KiB` : bytesOf(code.size);
  return `${digest} · ${files}, ${size}`;
}

// A run's idle policy as a sentence: "Stop when every GPU stays under 5% for 30m" (notify: "Tell
// the workspace when …"), its utilization as the spec gives it and its window as written.
export function idlePolicyText(policy: IdlePolicy): string {
  const what = policy.action === "notify" ? "Tell the workspace" : "Stop";
  return `${what} when every GPU stays under ${policy.gpuUtilizationBelow}% for ${policy.window}`;
}

interface TaskMetrics {
  tasks: { name: string; metrics: Record<string, number | Record<string, number>> }[];
}

function values(metric: number | Record<string, number> | undefined): number[] {
  if (metric === undefined) return [];
  return typeof metric === "number" ? [metric] : Object.values(metric);
}

// Workers running of total, GPUs, Machines, Time left or Runtime, Using now (GPU %, cores,
// memory), Priority with how it starts and fails, and Idle policy where it has one.
export function Readout({ run }: { run: Run }) {
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
      {run.code && (
        <div className="readout-wide">
          <dt>Code</dt>
          <dd data-figure="code" title={run.code.digest}>
            {codeText(run.code)}
          </dd>
        </div>
      )}
      {run.idlePolicy && (
        <div className="readout-wide">
          <dt>Idle policy</dt>
          <dd data-figure="idle-policy">{idlePolicyText(run.idlePolicy)}</dd>
        </div>
      )}
    </dl>
  );
}

