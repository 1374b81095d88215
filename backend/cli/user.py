"""``astra``: the user's command line (``astra astraeus …``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    print(
        "astra: the user commands (astra astraeus goodput, logs, status, workers, runs, gpus) "
        f"are not built yet; asked for: {' '.join(args) or '(nothing)'}",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
