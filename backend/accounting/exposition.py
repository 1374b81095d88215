"""The goodput ledgers in Prometheus' text exposition format (seed: "Prometheus and
OpenTelemetry"), pure: figures in, text out.

All are gauges over whole hours: the hourly counts are kept 400 days and pruned, so a counter
would go down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backend.accounting.rules import Category, Ledger

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

HELP = {
    "astraeus_goodput_ratio": (
        "Productive over held, in the current UTC hour or the last 24 hours."
    ),
    "astraeus_goodput_gpu_hours": "GPU-hours by category.",
    "astraeus_run_goodput_gpu_hours": (
        "A run's GPU-hours by category, since it was submitted (runs still going)."
    ),
    "astraeus_run_goodput_ratio": "A run's goodput: productive over held, since it was submitted.",
    "astraeus_workers_stalled": "Workers stalled now.",
    "astraeus_runs_with_straggler": "Runs whose gang has a straggler now.",
    "astraeus_threshold_alerts_firing": "Threshold alerts firing (a cluster's operators only).",
}


@dataclass
class Exposition:
    """Samples by metric, written in the order of HELP."""

    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    def add(self, metric: str, labels: dict[str, str], value: float) -> None:
        assert metric in HELP, metric
        self.samples.setdefault(metric, []).append((labels, value))

    def ledger(self, scope: str, name: str, window: str, ledger: Ledger) -> None:
        """A scope's figures in one window: its ratio (when something was held) and its
        GPU-hours by category (held and not held together, as ``gpu_hours``)."""
        base = {"scope": scope, "name": name, "window": window}
        if ledger.goodput is not None:
            self.add("astraeus_goodput_ratio", base, ledger.goodput)
        for category in Category:
            hours = (ledger.held[category] + ledger.not_held[category]) / 3600
            self.add("astraeus_goodput_gpu_hours", {**base, "category": category.value}, hours)

    def run(self, namespace: str, run: str, ledger: Ledger) -> None:
        base = {"namespace": namespace, "run": run}
        for category in Category:
            hours = (ledger.held[category] + ledger.not_held[category]) / 3600
            self.add("astraeus_run_goodput_gpu_hours", {**base, "category": category.value}, hours)
        if ledger.goodput is not None:
            self.add("astraeus_run_goodput_ratio", base, ledger.goodput)

    def text(self) -> str:
        lines: list[str] = []
        for metric, help_ in HELP.items():
            samples = self.samples.get(metric)
            if not samples:
                continue
            lines.append(f"# HELP {metric} {help_}")
            lines.append(f"# TYPE {metric} gauge")
            lines.extend(f"{metric}{_labels(labels)} {_value(v)}" for labels, v in samples)
        return "\n".join(lines) + "\n" if lines else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def _value(value: float) -> str:
    return repr(float(round(value, 9)))
