// Goodput (seed goodput.txt, "In the console"): goodput, GPU time held, productive, not
// productive (with the biggest loss) and waiting; workers stalled and stragglers now and
// threshold alerts firing, listed first; then a row per run, machine, pool or workspace with
// a bar of where its time went. By week (8) shows the last eight weeks. A bar's segment opens
// the worker intervals behind it. Over time (issue 23): the workspace's, or a row's, GPU time
// hour by hour in a stacked chart with its goodput; a click on an hour opens its intervals.
// Idle GPUs given back (issue 41): what the idle policies stopped over the last 7 days.
import { useEffect, useState } from "react";

import { STYLE } from "../categories";
import { GoodputOverTime } from "../components/GoodputOverTime";
import { Legend } from "../components/Legend";
import { StackedBar } from "../components/StackedBar";
import { decimalsFor, gpuHours, percent, when } from "../format";
import type {
  GoodputCategory,
  GoodputQuery,
  GoodputScope,
  IntervalsQuery,
  ReportFieldsFragment,
  WeeklyQuery,
} from "../generated/graphql";
import { biggestHeldLoss, figuresOf, LEDGER_FIELDS, type Ledger } from "../ledger";
import { Link } from "../nav";
import { runPath } from "../routes";
import { useQuery } from "../useQuery";
import { CostView } from "./CostView";
import { IdleGivenBack } from "./IdleGivenBack";
import { Head } from "../components/Table";

export type Scope = GoodputScope;
const SCOPES: Scope[] = ["RUN", "MACHINE", "POOL", "WORKSPACE"];
const SCOPE_LABEL: Record<Scope, string> = {
  RUN: "Runs",
  MACHINE: "Machines",
  POOL: "Pools",
  WORKSPACE: "Workspaces",
};
const SCOPE_COLUMN: Record<Scope, string> = { RUN: "Run", MACHINE: "Machine", POOL: "Pool", WORKSPACE: "Workspace" };

// A report and its first 200 rows.
const REPORT_FIELDS = /* GraphQL */ `
  fragment ReportFields on GoodputReport {
    start end rowCount total { ...LedgerFields } rows(first: 200) { name ledger { ...LedgerFields } }
  }`;
const GOODPUT = /* GraphQL */ `
  query Goodput($by: GoodputScope!, $start: DateTime, $ws: String) {
    goodput(by: $by, start: $start, workspace: $ws) { ...ReportFields }
    attention(workspace: $ws) { run worker kind since reason machine }
    alertsFiring { metric subject reason firedAt }
  }`;
const WEEKS = /* GraphQL */ `
  query Weekly($by: GoodputScope!, $ws: String) {
    goodputWeekly(by: $by, weeks: 8, workspace: $ws) { week report { ...ReportFields } }
  }`;
// Each document with the fragments it spreads.
const PAGE = GOODPUT + REPORT_FIELDS + LEDGER_FIELDS;
const WEEKLY = WEEKS + REPORT_FIELDS + LEDGER_FIELDS;

type Report = ReportFieldsFragment;
type Attention = GoodputQuery["attention"][number];
type Alert = GoodputQuery["alertsFiring"][number];

// What the intervals shown are of: a row's (or the workspace's) category, or all of an hour.
export interface Picked {
  by: Scope;
  name: string;
  category: GoodputCategory | null;
  start: string;
  end: string;
}

export function Goodput({ org, workspace }: { org: string; workspace: string }) {
  const [by, setBy] = useState<Scope>("RUN");
  const [weekly, setWeekly] = useState(false);
  const [picked, setPicked] = useState<Picked | null>(null);
  // the row charted over time; null: the whole workspace
  const [charted, setCharted] = useState<string | null>(null);
  const chartBy: Scope = charted ? by : "WORKSPACE";
  const chartName = charted ?? workspace;
  const [start] = useState(() => new Date(Date.now() - 7 * 24 * 3600 * 1000).toISOString());
  const page = useQuery<GoodputQuery>(PAGE, {
    by,
    start,
    ws: workspace,
  });
  const weeks = useQuery<WeeklyQuery>(
    WEEKLY,
    { by, ws: workspace },
    weekly,
  );

  return (
    <main className="page" aria-labelledby="goodput-title">
      <header className="page-head">
        <h1 id="goodput-title">Goodput</h1>
        <div className="controls">
          <label>
            By{" "}
            <select
              value={by}
              onChange={(e) => {
                setBy(e.target.value as Scope);
                setCharted(null);
              }}
              aria-label="By"
            >
              {SCOPES.map((s) => (
                <option key={s} value={s}>
                  {SCOPE_LABEL[s]}
                </option>
              ))}
            </select>
          </label>
          <div className="tabs" role="tablist">
            <button role="tab" aria-selected={!weekly} onClick={() => setWeekly(false)}>
              Last 7 days
            </button>
            <button role="tab" aria-selected={weekly} onClick={() => setWeekly(true)}>
              By week (8)
            </button>
          </div>
        </div>
      </header>
      {page.error && <p className="error" role="alert">{page.error}</p>}
      {page.data && <NeedsAttention attention={page.data.attention} alerts={page.data.alertsFiring} />}
      {!weekly && page.loading && !page.data && <p className="muted">Loading…</p>}
      {!weekly && page.data && (
        <section className="over-time" aria-label="Over time">
          <label>
            Over time{" "}
            <select aria-label="Over time" value={charted ?? ""} onChange={(e) => setCharted(e.target.value || null)}>
              <option value="">Workspace {workspace}</option>
              {page.data.goodput.rows.map((r) => (
                <option key={r.name} value={r.name}>
                  {SCOPE_COLUMN[by]} {r.name}
                </option>
              ))}
            </select>
          </label>
          <GoodputOverTime
            by={chartBy}
            name={chartName}
            workspace={workspace}
            start={start}
            title={`${chartName}, hour by hour`}
            onPoint={(p) => setPicked({ by: chartBy, name: chartName, category: null, start: p.start, end: p.end })}
          />
        </section>
      )}
      {!weekly && page.data && (
        <ReportView
          report={page.data.goodput}
          by={by}
          runLink={(run) => runPath(org, workspace, run)}
          onSegment={(name, category) =>
            setPicked({ by, name, category, start: page.data!.goodput.start, end: page.data!.goodput.end })
          }
        />
      )}
      {!weekly && page.data && (by === "RUN" || by === "WORKSPACE") && <CostView by={by} start={start} workspace={workspace} />}
      {!weekly && page.data && <IdleGivenBack org={org} workspace={workspace} />}
      {weekly && weeks.error && <p className="error" role="alert">{weeks.error}</p>}
      {weekly && weeks.loading && !weeks.data && <p className="muted">Loading…</p>}
      {weekly &&
        weeks.data?.goodputWeekly
          .slice()
          .reverse()
          .map(({ week, report }) => (
            <section key={week} aria-label={`Week ${week}`}>
              <h2>Week {week}</h2>
              <ReportView
                report={report}
                by={by}
                runLink={(run) => runPath(org, workspace, run)}
                onSegment={(name, category) => setPicked({ by, name, category, start: report.start, end: report.end })}
              />
            </section>
          ))}
      {picked && <Intervals workspace={workspace} {...picked} onClose={() => setPicked(null)} />}
      <Legend />
    </main>
  );
}

function NeedsAttention({ attention, alerts }: { attention: Attention[]; alerts: Alert[] }) {
  if (attention.length === 0 && alerts.length === 0) return null;
  return (
    <section className="attention" aria-label="Needs attention">
      <h2>Needs attention</h2>
      <ul>
        {attention.map((a) => (
          <li key={`${a.kind}-${a.worker}`}>
            <strong>{a.kind === "stalled" ? "Stalled" : "Straggler"}</strong> {a.worker}
            {a.machine ? ` on ${a.machine}` : ""}: {a.reason} <span className="muted">since {when(a.since)}</span>
          </li>
        ))}
        {alerts.map((a) => (
          <li key={`${a.metric}-${a.subject}`}>
            <strong>Alert</strong> {a.subject}: {a.reason} <span className="muted">since {when(a.firedAt)}</span>
          </li>
        ))}
      </ul>
    </section>
  );
}

// `decimals`: the view's (decimalsFor), so that the summary and the rows under it say the same
// digits, and not productive is held less productive as printed.
export function Summary({ total, decimals }: { total: Ledger; decimals: number }) {
  const loss = biggestHeldLoss(total);
  const shown = figuresOf(total, decimals);
  return (
    <dl className="summary">
      <div>
        <dt>Goodput</dt>
        <dd data-figure="goodput">{percent(total.goodput)}</dd>
      </div>
      <div>
        <dt>GPU time held</dt>
        <dd data-figure="held">{shown.held} GPU-h</dd>
      </div>
      <div>
        <dt>Productive</dt>
        <dd data-figure="productive">{shown.productive} GPU-h</dd>
      </div>
      <div>
        <dt>Not productive</dt>
        <dd data-figure="not-productive">
          {shown.notProductive} GPU-h
          {loss && (
            <span className="muted">
              {" "}
              biggest loss: {STYLE[loss.category].label} {shown.part(loss.category)}
            </span>
          )}
        </dd>
      </div>
      <div>
        <dt>Waiting</dt>
        <dd data-figure="waiting">{shown.waiting} GPU-h</dd>
      </div>
    </dl>
  );
}

function ReportView({
  report,
  by,
  runLink,
  onSegment,
}: {
  report: Report;
  by: Scope;
  runLink: (run: string) => string;
  onSegment: (name: string, category: GoodputCategory) => void;
}) {
  const scale = Math.max(0, ...report.rows.map((r) => r.ledger.allocatedGpuHours + r.ledger.waitingGpuHours));
  // one count of decimals for the summary and every row, as the CLI's table has
  const decimals = decimalsFor([report.total, ...report.rows.map((r) => r.ledger)].map((l) => l.allocatedGpuHours));
  return (
    <>
      <Summary total={report.total} decimals={decimals} />
      {report.rows.length === 0 ? (
        <p className="empty">
          No GPU time in this period. Submit a run (astra astraeus submit spec.json) and its time appears here
          within a minute.
        </p>
      ) : (
        <table className="ledger">
          <Head
            columns={[
              SCOPE_COLUMN[by],
              { label: "Held", num: true },
              { label: "Used", num: true },
              { label: "Goodput", num: true },
              { label: "Waiting", num: true },
              "Where the time went",
            ]}
          />
          <tbody>
            {report.rows.map((r) => {
              const shown = figuresOf(r.ledger, decimals);
              return (
                <tr key={r.name} data-row={r.name}>
                  <th scope="row">{by === "RUN" ? <Link to={runLink(r.name)}>{r.name}</Link> : r.name}</th>
                  <td className="num" data-figure="held">
                    {shown.held}
                  </td>
                  <td className="num" data-figure="used">
                    {shown.productive}
                  </td>
                  <td className="num" data-figure="goodput">
                    {percent(r.ledger.goodput)}
                  </td>
                  <td className="num" data-figure="waiting">
                    {shown.waiting}
                  </td>
                  <td className="bar-cell">
                    <StackedBar
                      ledger={r.ledger}
                      name={r.name}
                      scale={scale}
                      decimals={decimals}
                      onSegment={(c) => onSegment(r.name, c)}
                    />
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
      {report.rowCount > report.rows.length && (
        <p className="muted">
          The {report.rows.length} that held the most of {report.rowCount}.
        </p>
      )}
    </>
  );
}

const INTERVALS = /* GraphQL */ `query Intervals($by: GoodputScope!, $name: String!, $category: String, $start: DateTime, $end: DateTime, $ws: String) {
  goodputIntervals(by: $by, name: $name, category: $category, start: $start, end: $end, workspace: $ws, limit: 500) {
    worker machine start end category held gpus
  }
}`;

// The worker intervals behind a figure: a category's (its held part; waiting: all not held),
// or, with no category, all of them (an hour of the chart).
export function Intervals(props: Picked & { workspace: string; onClose: () => void }) {
  const { by, workspace, name, category, start, end, onClose } = props;
  // Waiting is every category's time not held: all the intervals, then the ones not held.
  const found = useQuery<IntervalsQuery>(INTERVALS, {
    by,
    name,
    category: category === "waiting" ? null : category,
    start,
    end,
    ws: workspace,
  });
  const all = found.data?.goodputIntervals ?? [];
  const rows = category === null ? all : all.filter((i) => (category === "waiting" ? !i.held : i.held));
  const hours = (i: (typeof all)[number]) => ((Date.parse(i.end) - Date.parse(i.start)) / 3.6e6) * i.gpus;
  const decimals = decimalsFor(rows.map(hours));
  const what = category === null ? `GPU time of ${name}, ${when(start)} to ${when(end)}` : `${STYLE[category].label} of ${name}`;
  useEffect(() => {
    const close = (e: KeyboardEvent) => e.key === "Escape" && onClose();
    window.addEventListener("keydown", close);
    return () => window.removeEventListener("keydown", close);
  }, [onClose]);
  return (
    <section className="intervals" aria-label={`${category === null ? "All" : STYLE[category].label} intervals of ${name}`}>
      <header>
        <h2>{what}: the worker intervals behind it</h2>
        <button type="button" onClick={onClose}>
          Close
        </button>
      </header>
      {found.error && <p className="error">{found.error}</p>}
      {found.loading && <p className="muted">Loading…</p>}
      {found.data && rows.length === 0 && <p className="empty">No intervals.</p>}
      {rows.length > 0 && (
        <table className="ledger">
          <Head
            columns={[
              "Worker",
              "Machine",
              ...(category === null ? ["Category"] : []),
              "From",
              "To",
              { label: "GPUs", num: true },
              { label: "GPU-hours", num: true },
            ]}
          />
          <tbody>
            {rows.map((i) => (
              <tr key={`${i.worker}-${i.start}-${i.held}`}>
                <td>{i.worker}</td>
                <td>{i.machine ?? "—"}</td>
                {category === null && <td data-figure="category">{i.held ? STYLE[i.category].label : "Waiting"}</td>}
                <td>{when(i.start)}</td>
                <td>{when(i.end)}</td>
                <td className="num">{i.gpus}</td>
                <td className="num">
                  {gpuHours(hours(i), decimals)}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}
