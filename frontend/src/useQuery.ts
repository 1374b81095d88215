import { useEffect, useState } from "react";

import { ApiError, graphql } from "./api";

export interface QueryState<T> {
  data: T | null;
  error: string | null;
  loading: boolean;
}

// A GraphQL query, asked again when its variables change and every `refreshMs` (the ledgers
// move once a minute). A signed-out answer sends the reader to sign in.
export function useQuery<T>(
  query: string,
  variables: Record<string, unknown>,
  enabled = true,
  refreshMs = 60_000,
): QueryState<T> {
  const [state, setState] = useState<QueryState<T>>({ data: null, error: null, loading: enabled });
  const key = JSON.stringify(variables);
  useEffect(() => {
    if (!enabled) return;
    let live = true;
    const load = () => {
      setState((s) => ({ ...s, loading: true }));
      graphql<T>(query, JSON.parse(key) as Record<string, unknown>).then(
        (data) => live && setState({ data, error: null, loading: false }),
        (error: unknown) => {
          if (!live) return;
          if (error instanceof ApiError && error.code === "UNAUTHENTICATED") {
            window.location.assign("/signin");
            return;
          }
          setState({ data: null, error: error instanceof Error ? error.message : String(error), loading: false });
        },
      );
    };
    load();
    const timer = refreshMs > 0 ? window.setInterval(load, refreshMs) : undefined;
    return () => {
      live = false;
      window.clearInterval(timer);
    };
  }, [query, key, enabled, refreshMs]);
  return state;
}
