// The Logs tab: one worker's last 5 000 lines, followed live (on by default), Find…, the count
// of error-like lines and Errors only (the lines saying error), Download of what is shown as
// <worker>.log (seed L-7, L-8, L-9 … L-12).
import { useEffect, useMemo, useRef, useState } from "react";

import { rest } from "../api";
import { counted, plural } from "../format";
import type { FollowLogSubscription } from "../generated/graphql";
import { subscribe } from "../live";
import { append, isErrorLike, KEEP, saved, shown } from "./lines";

const FOLLOW = /* GraphQL */ `subscription FollowLog($w: String!, $tail: Int!) {
  followLog(worker: $w, tail: $tail) { text missed ended } }`;

type Chunk = FollowLogSubscription["followLog"];

async function tail(worker: string): Promise<string[] | null> {
  try {
    const body = await rest<{ logs: string }>(`/tasks/${encodeURIComponent(worker)}/logs?tail=${KEEP}`);
    return append([], "", body.logs.endsWith("\n") ? body.logs : `${body.logs}\n`).lines;
  } catch {
    return null;
  }
}

export function LogView({
  workers,
  worker,
  onWorker,
}: {
  workers: string[];
  worker: string;
  onWorker: (worker: string) => void;
}) {
  const [lines, setLines] = useState<string[]>([]);
  const [follow, setFollow] = useState(true);
  const [find, setFind] = useState("");
  const [errorsOnly, setErrorsOnly] = useState(false);
  const [status, setStatus] = useState<string | null>(null);
  const partial = useRef("");
  const bottom = useRef<HTMLDivElement>(null);

  useEffect(() => {
    setLines([]);
    partial.current = "";
    setStatus(null);
  }, [worker]);

  useEffect(() => {
    if (!follow) return;
    setStatus("Following");
    let first = true;
    // Another worker picked (or Follow unticked) ends this follow: graphql-ws then completes
    // it, which must not untick Follow for the next one (it did: the log stayed empty).
    let disposed = false;
    const stop = subscribe<Chunk>(
      FOLLOW,
      // the last 5 000 lines, then each new one as it is written (one stream: none twice)
      { w: worker, tail: KEEP },
      {
        next: (chunk) => {
          if (disposed) return;
          setLines((kept) => {
            const base = first ? [] : kept;
            if (first) partial.current = "";
            first = false;
            const missed = chunk.missed ? [`[… ${counted(chunk.missed, "line")} missed]`] : [];
            const next = append(base.concat(missed), partial.current, chunk.text);
            partial.current = next.partial;
            return next.lines;
          });
          if (chunk.ended) setStatus("The worker ended: its log is complete.");
        },
        // not followable (its machine is away, or it never started): what the machine kept
        error: (message) => {
          if (disposed) return;
          setStatus(message);
          void tail(worker).then((found) => found !== null && setLines(found));
        },
        complete: () => {
          if (!disposed) setFollow(false);
        },
      },
    );
    return () => {
      disposed = true;
      stop();
    };
  }, [worker, follow]);

  const visible = useMemo(() => shown(lines, find, errorsOnly), [lines, find, errorsOnly]);
  const errors = useMemo(() => lines.filter(isErrorLike).length, [lines]);

  useEffect(() => {
    if (follow && !find && !errorsOnly) bottom.current?.scrollIntoView?.({ block: "end" });
  }, [visible, follow, find, errorsOnly]);

  // seed L-8: what is shown (after Find… and Errors only), not every line kept
  const download = () => {
    const blob = new Blob([saved(visible)], { type: "text/plain" });
    const link = document.createElement("a");
    link.href = URL.createObjectURL(blob);
    link.download = `${worker}.log`;
    link.click();
    URL.revokeObjectURL(link.href);
  };

  return (
    <section className="logs" aria-label={`Log of ${worker}`}>
      <div className="log-tools">
        <label>
          Log ·{" "}
          <select value={worker} onChange={(e) => onWorker(e.target.value)} aria-label="Log ·">
            {workers.map((w) => (
              <option key={w}>{w}</option>
            ))}
          </select>
        </label>
        <label>
          <input type="checkbox" checked={follow} onChange={(e) => setFollow(e.target.checked)} /> Follow
        </label>
        <input
          type="search"
          placeholder="Find…"
          aria-label="Find…"
          value={find}
          onChange={(e) => setFind(e.target.value)}
        />
        <span className={errors ? "error" : "muted"} data-figure="errors">
          {errors} error-like {plural(errors, "line")}
        </span>
        <label>
          <input type="checkbox" checked={errorsOnly} onChange={(e) => setErrorsOnly(e.target.checked)} /> Errors
          only
        </label>
        <button type="button" onClick={download}>
          Download
        </button>
        {status && <span className="muted">{status}</span>}
      </div>
      <pre className="log" tabIndex={0} aria-live="off">
        {visible.map((line, i) => (
          <div key={i} className={isErrorLike(line) ? "log-line log-error" : "log-line"}>
            {line}
          </div>
        ))}
        <div ref={bottom} />
      </pre>
    </section>
  );
}
