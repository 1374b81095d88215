import { useEffect, useState, type FormEvent } from "react";

import { ApiError, graphql, signIn, signOut, token } from "../api";
import type { SignedInQuery } from "../generated/graphql";
import { goodputPath } from "../routes";

const VIEWER = /* GraphQL */ `query SignedIn { viewer { user organization workspace } }`;

// Sign in with an API token (`astraeus token create`, or the one `astraeus up` printed).
export function SignIn({ go }: { go: (path: string) => void }) {
  const [value, setValue] = useState("");
  const [error, setError] = useState<string | null>(null);
  const enter = async () => {
    try {
      const { viewer } = await graphql<SignedInQuery>(VIEWER);
      go(goodputPath(viewer.organization, viewer.workspace ?? "default"));
    } catch (err) {
      signOut();
      setError(err instanceof ApiError ? err.message : String(err));
    }
  };
  useEffect(() => {
    if (token()) void enter(); // signed in already: to the workspace's goodput
  }, []);
  const submit = async (e: FormEvent) => {
    e.preventDefault();
    if (!value.trim()) {
      setError("Paste an API token: astraeus up printed one, and astraeus token create makes more.");
      return;
    }
    signIn(value);
    await enter();
  };
  return (
    <main className="signin">
      <h1>Astraeus</h1>
      <p>Where every GPU-hour went, and why a run failed.</p>
      <form onSubmit={submit}>
        <label htmlFor="token">API token</label>
        <input
          id="token"
          type="password"
          autoComplete="off"
          autoFocus
          value={value}
          onChange={(e) => setValue(e.target.value)}
          placeholder="astx_…"
        />
        <button type="submit">Sign in</button>
        {error && (
          <p className="error" role="alert">
            {error}
          </p>
        )}
      </form>
    </main>
  );
}
