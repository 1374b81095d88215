import { CATEGORIES } from "../categories";

export function Legend() {
  return (
    <ul className="legend" aria-label="Categories">
      {CATEGORIES.map((c) => (
        <li key={c.category} title={c.meaning}>
          <span className="swatch" style={{ background: c.colour }} aria-hidden="true" />
          {c.label}
        </li>
      ))}
    </ul>
  );
}
