// The console's reads through one client, TanStack Query (issue 22: it replaced this file's own
// fetch-and-poll hook and RunPage's second polling loop): each read cached by what it asks,
// asked once for every component that wants it, asked again every `refreshMs` (the ledgers
// move once a minute) while its page is shown, its last answer kept while the next is on the
// way. A signed-out answer sends the reader to sign in. Subscriptions stay on graphql-ws
// (live.ts).
import { keepPreviousData, QueryCache, QueryClient, useQuery as useCached } from "@tanstack/react-query";

import { ApiError, graphql, rest } from "./api";

export interface QueryState<T> {
  data: T | null;
  error: string | null;
  loading: boolean;
}

export function dataClient(): QueryClient {
  return new QueryClient({
    queryCache: new QueryCache({
      onError: (error) => {
        if (error instanceof ApiError && error.code === "UNAUTHENTICATED") window.location.assign("/signin");
      },
    }),
    // No retries in between: the next refresh asks again, as a person reloading would.
    defaultOptions: { queries: { retry: false, refetchOnWindowFocus: false, placeholderData: keepPreviousData } },
  });
}

function state<T>(found: { data: T | undefined; error: Error | null; isFetching: boolean }): QueryState<T> {
  return { data: found.data ?? null, error: found.error ? found.error.message : null, loading: found.isFetching };
}

// A GraphQL query, asked again when its variables change and every `refreshMs` (0: never).
export function useQuery<T>(
  query: string,
  variables: Record<string, unknown>,
  enabled = true,
  refreshMs = 60_000,
): QueryState<T> {
  return state(
    useCached({
      queryKey: ["graphql", query, variables],
      queryFn: () => graphql<T>(query, variables),
      enabled,
      refetchInterval: refreshMs > 0 ? refreshMs : false,
    }),
  );
}

// A read of the REST shim (/v1), for what the seeds give only there, on the same terms.
export function useRest<T>(path: string, enabled = true, refreshMs = 60_000): QueryState<T> {
  return state(
    useCached({
      queryKey: ["rest", path],
      queryFn: () => rest<T>(path),
      enabled,
      refetchInterval: refreshMs > 0 ? refreshMs : false,
    }),
  );
}
