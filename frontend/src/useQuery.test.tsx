import { act, cleanup, screen } from "@testing-library/react";
import { afterEach, describe, expect, it, vi } from "vitest";

import { renderWithData } from "./testing/render";
import { useQuery, useRest } from "./useQuery";

afterEach(() => {
  cleanup();
  vi.useRealTimers();
  vi.unstubAllGlobals();
});

const VIEWER = `query V { viewer { user } }`;

// The server: counts the requests, answers each with its number.
function server() {
  const asked: string[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string) => {
      asked.push(url);
      const body = url === "/graphql" ? { data: { viewer: { user: `ann ${asked.length}` } } } : { tasks: asked.length };
      return new Response(JSON.stringify(body), { status: 200 });
    }),
  );
  return asked;
}

function Viewer({ id }: { id: string }) {
  const found = useQuery<{ viewer: { user: string } }>(VIEWER, {}, true, 10_000);
  return <p data-testid={id}>{found.data?.viewer.user ?? "…"}</p>;
}

function Tasks({ enabled }: { enabled: boolean }) {
  const found = useRest<{ tasks: number }>("/tasks?job=llama-sft", enabled, 15_000);
  return <p data-testid="tasks">{found.data?.tasks ?? "none"}</p>;
}

describe("the console's data client (issue 22: one client, not a hook of our own per page)", () => {
  it("asks once for the components that want the same, and again every refresh", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    const asked = server();
    renderWithData(
      <>
        <Viewer id="a" />
        <Viewer id="b" />
      </>,
    );
    await act(() => vi.advanceTimersByTimeAsync(100));
    expect(asked).toEqual(["/graphql"]);
    expect([screen.getByTestId("a").textContent, screen.getByTestId("b").textContent]).toEqual(["ann 1", "ann 1"]);
    await act(() => vi.advanceTimersByTimeAsync(10_000));
    expect(asked).toEqual(["/graphql", "/graphql"]);
    expect(screen.getByTestId("b").textContent).toBe("ann 2");
  });

  it("reads the REST shim on the same terms, and not at all while disabled (a run not running)", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    const asked = server();
    const { rerender } = renderWithData(<Tasks enabled={false} />);
    await act(() => vi.advanceTimersByTimeAsync(20_000));
    expect(asked).toEqual([]);
    rerender(<Tasks enabled />);
    await act(() => vi.advanceTimersByTimeAsync(100));
    expect(asked).toEqual(["/v1/tasks?job=llama-sft"]);
    await act(() => vi.advanceTimersByTimeAsync(15_000));
    expect(asked).toHaveLength(2);
    expect(screen.getByTestId("tasks").textContent).toBe("2");
  });
});
