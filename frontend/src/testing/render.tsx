// Components rendered as the console renders them: under a data client of their own (a fresh
// cache per test), kept across rerenders.
import { QueryClientProvider } from "@tanstack/react-query";
import { render, type RenderResult } from "@testing-library/react";
import type { ReactElement, ReactNode } from "react";

import { dataClient } from "../useQuery";

export function renderWithData(ui: ReactElement): RenderResult {
  const client = dataClient();
  const wrapper = ({ children }: { children: ReactNode }) => (
    <QueryClientProvider client={client}>{children}</QueryClientProvider>
  );
  return render(ui, { wrapper });
}
