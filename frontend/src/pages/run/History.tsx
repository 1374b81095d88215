import { Head, StateBadge } from "../../components/Table";
import { when } from "../../format";
import type { HistoryEntry } from "./model";

// A worker's own transitions, newest first as the API gives them (seed L-43).
export function History({ entries }: { entries: HistoryEntry[] }) {
  const rows = entries;
  return (
    <table className="ledger" aria-label="History">
      <Head columns={["When", "State", "Why"]} />
      <tbody>
        {rows.map((h, i) => (
          <tr key={`${h.transitionAt}-${i}`}>
            <td>{when(h.transitionAt)}</td>
            <td>
              <StateBadge state={h.state} />
            </td>
            <td className="wrap">{h.reason}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}
