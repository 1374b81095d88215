// The workspace's events (seed L-43, L-44, L-46): newest first, of one run or kind, older ones
// a page at a time; new ones arrive live through the events subscription.
import { useEffect, useState } from "react";

import { graphql } from "../api";
import { when } from "../format";
import type { EventFieldsFragment, EventsPageQuery } from "../generated/graphql";
import { subscribe } from "../live";
import { Link } from "../nav";
import { runPath } from "../routes";
import { Head, StateBadge } from "../components/Table";

type Event = EventFieldsFragment;

const FIELDS = /* GraphQL */ `
  fragment EventFields on Event { id kind state reason run worker createdAt foundAt }`;

// When it was found, where that is not when it happened (a stall is dated from the worker's
// last progress and found later): the list's order is the order found (issue 21).
export function foundLater(event: { createdAt: string; foundAt: string }): string | null {
  const found = Math.floor(Date.parse(event.foundAt) / 1000);
  return found > Math.floor(Date.parse(event.createdAt) / 1000) ? when(event.foundAt) : null;
}
const EVENTS = /* GraphQL */ `query EventsPage($name: String, $kind: String, $before: ID, $ws: String) {
  events(name: $name, kind: $kind, limit: 100, before: $before, workspace: $ws) { events { ...EventFields } nextBefore } }`;
const NEW_EVENTS = /* GraphQL */ `subscription NewEvents($name: String, $kind: String, $after: ID, $ws: String) {
  events(name: $name, kind: $kind, after: $after, workspace: $ws) { ...EventFields } }`;
const PAGE = EVENTS + FIELDS;
const LIVE = NEW_EVENTS + FIELDS;
const KINDS = ["", "run.state", "worker.state", "run.deleted", "alert.firing", "alert.resolved"];

export function EventsPage({ org, workspace }: { org: string; workspace: string }) {
  const [name, setName] = useState("");
  const [kind, setKind] = useState("");
  return (
    <main className="page" aria-labelledby="events-title">
      <header className="page-head">
        <h1 id="events-title">Events</h1>
        <div className="controls">
          <input type="search" placeholder="Run" aria-label="Run" value={name} onChange={(e) => setName(e.target.value)} />
          <select aria-label="Kind" value={kind} onChange={(e) => setKind(e.target.value)}>
            {KINDS.map((k) => (
              <option key={k} value={k}>
                {k || "every kind"}
              </option>
            ))}
          </select>
        </div>
      </header>
      <EventLog org={org} workspace={workspace} name={name.trim() || null} kind={kind || null} label="Events" />
    </main>
  );
}

// Events newest first, older ones a page at a time, new ones on top as they happen: the
// workspace's (the Events page) or one run's (its History tab, seed L-43).
export function EventLog(props: {
  org: string;
  workspace: string;
  name: string | null;
  kind: string | null;
  label: string;
}) {
  const { org, workspace, name, kind, label } = props;
  const [events, setEvents] = useState<Event[]>([]);
  const [next, setNext] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const filters = { name, kind, ws: workspace };
  const key = JSON.stringify(filters);

  useEffect(() => {
    let live = true;
    let stop = () => undefined as void;
    setEvents([]);
    setError(null);
    graphql<EventsPageQuery>(PAGE, { ...filters, before: null }).then(
      ({ events: page }) => {
        if (!live) return;
        setEvents(page.events);
        setNext(page.nextBefore);
        const after = page.events[0]?.id ?? null;
        stop = subscribe<Event>(LIVE, { ...filters, after }, {
          next: (event) => setEvents((shown) => (shown.some((e) => e.id === event.id) ? shown : [event, ...shown])),
          error: (message) => setError(message),
        });
      },
      (err: Error) => live && setError(err.message),
    );
    return () => {
      live = false;
      stop();
    };
  }, [key]);

  const older = async () => {
    const { events: page } = await graphql<EventsPageQuery>(PAGE, {
      ...filters,
      before: next,
    });
    setEvents((shown) => shown.concat(page.events));
    setNext(page.nextBefore);
  };

  return (
    <>
      {error && <p className="error" role="alert">{error}</p>}
      {events.length === 0 && !error && <p className="empty">No events yet.</p>}
      {events.length > 0 && (
        <table className="ledger" aria-label={label}>
          <Head columns={["When", "Kind", "Run or worker", "State", "Why"]} />
          <tbody>
            {events.map((e) => (
              <tr key={e.id} data-event={e.id}>
                <td>
                  {when(e.createdAt)}
                  {/* under its time, so the column stays narrow on a laptop's screen */}
                  {foundLater(e) && (
                    <div className="muted" data-figure="found-at">
                      found {foundLater(e)}
                    </div>
                  )}
                </td>
                <td>{e.kind}</td>
                <td>{e.run ? <Link to={runPath(org, workspace, e.run)}>{e.worker ?? e.run}</Link> : (e.worker ?? "—")}</td>
                <td>{e.state ? <StateBadge state={e.state} /> : "—"}</td>
                <td className="wrap">{e.reason}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {next !== null && (
        <button type="button" className="small" onClick={() => void older()}>
          Older
        </button>
      )}
    </>
  );
}
