// The console's paths, as the seed writes them: /o/<org>/w/<workspace>/…

export type Route =
  | { page: "signin" }
  | { page: "home" }
  | { page: "goodput"; org: string; workspace: string }
  | { page: "runs"; org: string; workspace: string }
  | { page: "gpus"; org: string; workspace: string }
  | { page: "events"; org: string; workspace: string }
  | { page: "machines"; org: string; workspace: string }
  | { page: "run"; org: string; workspace: string; run: string; tab: RunTab; worker: string | null }
  | { page: "worker"; org: string; workspace: string; cluster: string; worker: string }
  | { page: "notfound"; path: string };

export type RunTab = "workers" | "logs" | "metrics" | "history";
const TABS: RunTab[] = ["workers", "logs", "metrics", "history"];

export function parse(path: string, search = ""): Route {
  if (path === "/signin") return { page: "signin" };
  if (path === "/" || path === "") return { page: "home" };
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts.length >= 4 && parts[0] === "o" && parts[2] === "w") {
    const [, org, , workspace, ...rest] = parts;
    if (rest.length === 0 || (rest.length === 1 && rest[0] === "goodput")) {
      return { page: "goodput", org, workspace };
    }
    if (rest.length === 1 && (rest[0] === "runs" || rest[0] === "gpus" || rest[0] === "events" || rest[0] === "machines")) {
      return { page: rest[0], org, workspace };
    }
    if (rest.length === 2 && rest[0] === "runs") {
      const query = new URLSearchParams(search);
      const tab = TABS.find((t) => t === query.get("tab")) ?? "workers";
      return { page: "run", org, workspace, run: rest[1], tab, worker: query.get("worker") };
    }
    if (rest.length === 3 && rest[0] === "workers") {
      return { page: "worker", org, workspace, cluster: rest[1], worker: rest[2] };
    }
  }
  return { page: "notfound", path };
}

const base = (org: string, workspace: string) => `/o/${encodeURIComponent(org)}/w/${encodeURIComponent(workspace)}`;

export function goodputPath(org: string, workspace: string): string {
  return `${base(org, workspace)}/goodput`;
}

export function runsPath(org: string, workspace: string): string {
  return `${base(org, workspace)}/runs`;
}

export function runPath(org: string, workspace: string, run: string, tab?: RunTab, worker?: string): string {
  const query = new URLSearchParams();
  if (tab && tab !== "workers") query.set("tab", tab);
  if (worker) query.set("worker", worker);
  const search = query.toString();
  return `${base(org, workspace)}/runs/${encodeURIComponent(run)}${search ? `?${search}` : ""}`;
}

export function workerPath(org: string, workspace: string, cluster: string, worker: string): string {
  return `${base(org, workspace)}/workers/${encodeURIComponent(cluster)}/${encodeURIComponent(worker)}`;
}

export function sectionPath(org: string, workspace: string, section: "runs" | "gpus" | "events" | "machines"): string {
  return `${base(org, workspace)}/${section}`;
}
