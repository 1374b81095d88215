import { STYLE } from "../categories";
import type { GoodputCategory } from "../generated/graphql";
import { figuresOf, segments, type Ledger } from "../ledger";

interface Props {
  ledger: Ledger;
  name: string;
  // The longest bar on the page: bars are drawn to one scale so rows compare.
  scale: number;
  // the view's decimals (decimalsFor): a segment says the digits its row and summary say
  decimals: number;
  onSegment?: (category: GoodputCategory) => void;
}

export function StackedBar({ ledger, name, scale, decimals, onSegment }: Props) {
  const asked = ledger.allocatedGpuHours + ledger.waitingGpuHours;
  const width = scale > 0 ? (asked / scale) * 100 : 0;
  const shown = figuresOf(ledger, decimals);
  return (
    <div className="bar" role="group" aria-label={`Where ${name}'s GPU time went`}>
      <div className="bar-fill" style={{ width: `${width}%` }}>
        {segments(ledger).map((s) => {
          const style = STYLE[s.category];
          const title = `${style.label}: ${shown.part(s.category)} GPU-hours`;
          return (
            <button
              key={s.category}
              type="button"
              className={`segment segment-${s.category}`}
              style={{ width: `${s.share * 100}%`, background: style.colour }}
              title={title}
              aria-label={`${name} ${title}`}
              data-category={s.category}
              onClick={() => onSegment?.(s.category)}
            />
          );
        })}
      </div>
    </div>
  );
}
