"""``astra astraeus machines --worst``: the machines ranked by the GPU time lost on them
(issue 23: lemon machines), as GraphQL's machineHealth answers them.

MACHINE       POOL     LOST  FAILURES                FAULTS  VS POOL  ACTION
gpu-07        h100     12.4  5 (program 4, oom 1)         0     5.0×  drain: 5× its pool's …
"""

from __future__ import annotations

from typing import Any

HEADER = ("MACHINE", "POOL", "LOST", "FAILURES", "FAULTS", "VS POOL", "ACTION")
FOOTER = (
    "LOST = GPU-hours held in failure, restart and stalled; FAILURES = attempts that failed or "
    "stalled there; VS POOL = failures over its pool's other machines' median"
)


def _failures(row: dict[str, Any]) -> str:
    kinds = ", ".join(f"{k['kind']} {k['count']}" for k in row["failures"])
    return f"{row['failureCount']}" + (f" ({kinds})" if kinds else "")


def worst(rows: list[dict[str, Any]]) -> str:
    """A line a machine, worst first, the columns as wide as their widest cell."""
    cells = [
        (
            r["machine"],
            r["pool"] or "-",
            f"{r['lostGpuHours']:.1f}",
            _failures(r),
            str(r["faultCount"]),
            "-" if r.get("vsPool") is None else f"{r['vsPool']:.1f}\u00d7",
            r["action"],
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [HEADER, *cells]) for i in range(len(HEADER))]
    right = {2, 4, 5}  # the numbers

    def line(values: tuple[str, ...]) -> str:
        parts = [
            v.rjust(w) if i in right else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(HEADER), *(line(c) for c in cells), "", FOOTER])
