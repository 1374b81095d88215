// What every table and state of the console shares: a header row, and a state as a badge.

export interface Column {
  label: string;
  num?: boolean; // right-aligned figures
  hidden?: boolean; // named for screen readers only
}

export function Head({ columns }: { columns: (Column | string)[] }) {
  return (
    <thead>
      <tr>
        {columns.map((c) => {
          const column = typeof c === "string" ? { label: c } : c;
          return (
            <th key={column.label} scope="col" className={column.num ? "num" : undefined}>
              {column.hidden ? <span className="visually-hidden">{column.label}</span> : column.label}
            </th>
          );
        })}
      </tr>
    </thead>
  );
}

export function StateBadge({ state }: { state: string }) {
  return <span className={`state state-${state.toLowerCase()}`}>{state}</span>;
}

// "name: sentence" per line, as the panels list machines and workers.
export function Sentences({ label, items }: { label: string; items: { name: string; sentence: string }[] }) {
  return (
    <ul aria-label={label}>
      {items.map((item) => (
        <li key={item.name}>
          <strong>{item.name}</strong>: {item.sentence}
        </li>
      ))}
    </ul>
  );
}
