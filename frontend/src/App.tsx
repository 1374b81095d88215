import { useCallback, useEffect, useState } from "react";

import { signOut, token } from "./api";
import { Goodput } from "./pages/Goodput";
import { SignIn } from "./pages/SignIn";
import { goodputPath, parse } from "./routes";

export function App() {
  const [path, setPath] = useState(window.location.pathname);
  const go = useCallback((to: string) => {
    window.history.pushState(null, "", to);
    setPath(to);
  }, []);
  useEffect(() => {
    const back = () => setPath(window.location.pathname);
    window.addEventListener("popstate", back);
    return () => window.removeEventListener("popstate", back);
  }, []);

  const route = parse(path);
  if (route.page === "signin" || !token()) return <SignIn go={go} />;
  if (route.page === "home") {
    return <SignIn go={go} />;
  }
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
  return (
    <div className="shell">
      <nav className="menu" aria-label="Astraeus">
        <strong className="brand">Astraeus</strong>
        <span className="muted">
          {route.org} / {route.workspace}
        </span>
        <a
          href={goodputPath(route.org, route.workspace)}
          aria-current="page"
          onClick={(e) => {
            e.preventDefault();
            go(goodputPath(route.org, route.workspace));
          }}
        >
          Goodput
        </a>
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
      <Goodput workspace={route.workspace} />
    </div>
  );
}
