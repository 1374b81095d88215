// The GraphQL API with the signed-in token. Errors carry the server's own sentence.

const TOKEN_KEY = "astraeus.token";

export function token(): string | null {
  return window.localStorage.getItem(TOKEN_KEY);
}

export function signIn(value: string): void {
  window.localStorage.setItem(TOKEN_KEY, value.trim());
}

export function signOut(): void {
  window.localStorage.removeItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(
    message: string,
    readonly code: string | null,
  ) {
    super(message);
  }
}

export async function graphql<T>(query: string, variables: Record<string, unknown> = {}): Promise<T> {
  let answer: Response;
  try {
    answer = await fetch("/graphql", {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${token() ?? ""}` },
      body: JSON.stringify({ query, variables }),
    });
  } catch {
    throw new ApiError("Astraeus does not answer: is the server running?", "UNREACHABLE");
  }
  if (!answer.ok) {
    throw new ApiError(`The server answered ${answer.status}.`, `HTTP_${answer.status}`);
  }
  const body = (await answer.json()) as { data?: T; errors?: { message: string; extensions?: { code?: string } }[] };
  if (body.errors?.length) {
    const first = body.errors[0];
    throw new ApiError(first.message, first.extensions?.code ?? null);
  }
  return body.data as T;
}

// A call of the REST shim (/v1), for what the seeds give only there: its JSON, or an ApiError
// with the server's code and sentence.
export async function rest<T>(path: string): Promise<T> {
  let answer: Response;
  try {
    answer = await fetch(`/v1${path}`, { headers: { Authorization: `Bearer ${token() ?? ""}` } });
  } catch {
    throw new ApiError("Astraeus does not answer: is the server running?", "UNREACHABLE");
  }
  const body = (await answer.json().catch(() => ({}))) as T & { code?: string; message?: string };
  if (!answer.ok) throw new ApiError(body.message ?? `The server answered ${answer.status}.`, body.code ?? null);
  return body;
}
