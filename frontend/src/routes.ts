// The console's paths, as the seed writes them: /o/<org>/w/<workspace>/…

export type Route =
  | { page: "signin" }
  | { page: "home" }
  | { page: "goodput"; org: string; workspace: string }
  | { page: "notfound"; path: string };

export function parse(path: string): Route {
  if (path === "/signin") return { page: "signin" };
  if (path === "/" || path === "") return { page: "home" };
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  if (parts.length >= 4 && parts[0] === "o" && parts[2] === "w") {
    const [, org, , workspace, ...rest] = parts;
    if (rest.length === 0 || (rest.length === 1 && rest[0] === "goodput")) {
      return { page: "goodput", org, workspace };
    }
  }
  return { page: "notfound", path };
}

export function goodputPath(org: string, workspace: string): string {
  return `/o/${encodeURIComponent(org)}/w/${encodeURIComponent(workspace)}/goodput`;
}
