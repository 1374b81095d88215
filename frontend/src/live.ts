// GraphQL subscriptions over a WebSocket (graphql-transport-ws), the token in connection_init.
import { createClient, type Client } from "graphql-ws";

import { token } from "./api";

let client: Client | null = null;

function live(): Client {
  if (client === null) {
    const scheme = window.location.protocol === "https:" ? "wss" : "ws";
    client = createClient({
      url: `${scheme}://${window.location.host}/graphql`,
      connectionParams: () => ({ Authorization: `Bearer ${token() ?? ""}` }),
      retryAttempts: 5,
    });
  }
  return client;
}

// Each value of the subscription's field, until it completes or `stop()` is called.
export function subscribe<T>(
  query: string,
  variables: Record<string, unknown>,
  on: { next: (value: T) => void; error: (message: string) => void; complete?: () => void },
): () => void {
  return live().subscribe<Record<string, T>>(
    { query, variables },
    {
      next: (result) => {
        if (result.errors?.length) on.error(result.errors[0].message);
        else if (result.data) on.next(Object.values(result.data)[0]);
      },
      error: (err) => on.error(err instanceof Error ? err.message : "The live connection closed."),
      complete: () => on.complete?.(),
    },
  );
}
