import { createContext, useContext, type MouseEvent, type ReactNode } from "react";

// Client-side navigation: links change the path without reloading the console.
export const Navigate = createContext<(path: string) => void>((path) => window.location.assign(path));

export function useNavigate(): (path: string) => void {
  return useContext(Navigate);
}

export function Link({ to, children, className }: { to: string; children: ReactNode; className?: string }) {
  const go = useNavigate();
  const click = (e: MouseEvent<HTMLAnchorElement>) => {
    if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return; // a new tab, as asked
    e.preventDefault();
    go(to);
  };
  return (
    <a href={to} onClick={click} className={className}>
      {children}
    </a>
  );
}
