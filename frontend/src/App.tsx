import { useCallback, useEffect, useState, type ReactNode } from "react";

import { signOut, token } from "./api";
import type { ShellViewerQuery } from "./generated/graphql";
import { Link, Navigate } from "./nav";
import { Goodput } from "./pages/Goodput";
import { RunPage } from "./pages/RunPage";
import { RunsPage } from "./pages/RunsPage";
import { SignIn } from "./pages/SignIn";
import { WorkerPage } from "./pages/WorkerPage";
import { EventsPage } from "./pages/EventsPage";
import { GpusPage } from "./pages/GpusPage";
import { MachinesPage } from "./pages/MachinesPage";
import { goodputPath, parse, sectionPath, type Route } from "./routes";
import { useQuery } from "./useQuery";

export function App() {
  const [location, setLocation] = useState(() => ({
    path: window.location.pathname,
    search: window.location.search,
  }));
  const go = useCallback((to: string) => {
    window.history.pushState(null, "", to);
    setLocation({ path: window.location.pathname, search: window.location.search });
    window.scrollTo?.(0, 0);
  }, []);
  useEffect(() => {
    const back = () => setLocation({ path: window.location.pathname, search: window.location.search });
    window.addEventListener("popstate", back);
    return () => window.removeEventListener("popstate", back);
  }, []);

  const route = parse(location.path, location.search);
  return <Navigate.Provider value={go}>{page(route, go)}</Navigate.Provider>;
}

function page(route: Route, go: (path: string) => void): ReactNode {
  if (route.page === "signin" || route.page === "home" || !token()) return <SignIn go={go} />;
  if (route.page === "notfound") {
    return (
      <main className="page">
        <h1>Not found</h1>
        <p>
          Nothing is at {route.path}. <a href="/">Go to the start</a>.
        </p>
      </main>
    );
  }
  return <Shell route={route} go={go} />;
}

type Section = "goodput" | "runs" | "gpus" | "events" | "machines";

const VIEWER = /* GraphQL */ `query ShellViewer { viewer { user isOrgAdmin } }`;

function Shell({ route, go }: { route: Exclude<Route, { page: "signin" | "home" | "notfound" }>; go: (path: string) => void }) {
  const { org, workspace } = route;
  const viewer = useQuery<ShellViewerQuery>(VIEWER, {}, true, 0);
  const section: Section =
    route.page === "run" ? "runs" : route.page === "worker" ? "runs" : route.page;
  const items: { section: Section; label: string; to: string }[] = [
    { section: "goodput", label: "Goodput", to: goodputPath(org, workspace) },
    { section: "runs", label: "Runs", to: sectionPath(org, workspace, "runs") },
    { section: "gpus", label: "GPUs", to: sectionPath(org, workspace, "gpus") },
    { section: "events", label: "Events", to: sectionPath(org, workspace, "events") },
  ];
  if (viewer.data?.viewer.isOrgAdmin) {
    items.push({ section: "machines", label: "Machines", to: sectionPath(org, workspace, "machines") });
  }
  return (
    <div className="shell">
      <nav className="menu" aria-label="Astraeus">
        <strong className="brand">Astraeus</strong>
        <span className="muted">
          {org} / {workspace}
          {viewer.data ? ` · ${viewer.data.viewer.user}` : ""}
        </span>
        {items.map((item) => (
          <MenuLink key={item.section} to={item.to} current={section === item.section}>
            {item.label}
          </MenuLink>
        ))}
        <button
          type="button"
          className="link"
          onClick={() => {
            signOut();
            go("/signin");
          }}
        >
          Sign out
        </button>
      </nav>
      {route.page === "goodput" && <Goodput org={org} workspace={workspace} />}
      {route.page === "runs" && <RunsPage org={org} workspace={workspace} />}
      {route.page === "run" && (
        <RunPage org={org} workspace={workspace} run={route.run} tab={route.tab} worker={route.worker} />
      )}
      {route.page === "worker" && <WorkerPage org={org} workspace={workspace} worker={route.worker} />}
      {route.page === "gpus" && <GpusPage org={org} workspace={workspace} />}
      {route.page === "events" && <EventsPage org={org} workspace={workspace} />}
      {route.page === "machines" && <MachinesPage />}
    </div>
  );
}

function MenuLink({ to, current, children }: { to: string; current: boolean; children: ReactNode }) {
  return (
    <span aria-current={current ? "page" : undefined} className="menu-item">
      <Link to={to}>{children}</Link>
    </span>
  );
}
