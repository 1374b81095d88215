import { useCallback, useEffect, useState, type ReactNode } from "react";

import { signOut, token } from "./api";
import { Link, Navigate } from "./nav";
import { Goodput } from "./pages/Goodput";
import { RunPage } from "./pages/RunPage";
import { RunsPage } from "./pages/RunsPage";
import { SignIn } from "./pages/SignIn";
import { WorkerPage } from "./pages/WorkerPage";
import { goodputPath, parse, runsPath, type Route } from "./routes";

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
  const { org, workspace } = route;
  const section = route.page === "goodput" ? "goodput" : "runs";
  return (
    <div className="shell">
      <nav className="menu" aria-label="Astraeus">
        <strong className="brand">Astraeus</strong>
        <span className="muted">
          {org} / {workspace}
        </span>
        <MenuLink to={goodputPath(org, workspace)} current={section === "goodput"}>
          Goodput
        </MenuLink>
        <MenuLink to={runsPath(org, workspace)} current={section === "runs"}>
          Runs
        </MenuLink>
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
