"""The goodput ledgers in Prometheus' text exposition format (seed: "Prometheus and
OpenTelemetry"), pure: figures in, text out, written by ``prometheus_client``. What a scrape
shows, read from the ledgers: prometheus.py.

All are gauges over whole hours: the hourly counts are kept 400 days and pruned, so a counter
would go down. The figures come from the ledger at each scrape, so they are a custom collector
yielding gauge families (prometheus_client's pattern for "metrics from another system"), not
gauges kept up to date in a process-wide registry.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.accounting.rules import Category, Ledger

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Each gauge: its help and its labels, in the order they are written.
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "astraeus_goodput_ratio": (
        "Productive over held, in the current UTC hour or the last 24 hours.",
        ("scope", "name", "window"),
    ),
    "astraeus_goodput_gpu_hours": (
        "GPU-hours by category.",
        ("scope", "name", "window", "category"),
    ),
    "astraeus_run_goodput_gpu_hours": (
        "A run's GPU-hours by category, since it was submitted (runs still going).",
        ("namespace", "run", "category"),
    ),
    "astraeus_run_goodput_ratio": (
        "A run's goodput: productive over held, since it was submitted.",
        ("namespace", "run"),
    ),
    "astraeus_workers_stalled": ("Workers stalled now.", ("namespace",)),
    "astraeus_runs_with_straggler": ("Runs whose gang has a straggler now.", ("namespace",)),
    "astraeus_gpus_unhealthy": (
        "GPUs unhealthy now (an XID, uncorrectable ECC errors, row remapping), by cluster.",
        ("cluster",),
    ),
    "astraeus_slurm_import_lag_seconds": (
        "Seconds since the import last read a Slurm-backed cluster's jobs (issue 38): how far "
        "behind Slurm its runs' states and ledgers may be.",
        ("cluster",),
    ),
    "astraeus_slurm_import_failing": (
        "1 while a Slurm-backed cluster's last import failed (astraeus cluster status says "
        "why), else 0.",
        ("cluster",),
    ),
    "astraeus_slurm_records_quarantined": (
        "Records of Slurm's output the last import could not read and set aside, by cluster.",
        ("cluster",),
    ),
    "astraeus_threshold_alerts_firing": (
        "Threshold alerts firing (a cluster's operators only).",
        ("metric",),
    ),
}


class Exposition(Collector):
    """One scrape's gauges, collected in the order of GAUGES; a gauge without samples is left
    out."""

    def __init__(self) -> None:
        self._families: dict[str, GaugeMetricFamily] = {}

    def add(self, metric: str, labels: dict[str, str], value: float) -> None:
        help_, names = GAUGES[metric]
        assert tuple(labels) == names, (metric, labels)
        family = self._families.get(metric)
        if family is None:
            family = self._families[metric] = GaugeMetricFamily(metric, help_, labels=names)
        family.add_metric(list(labels.values()), round(float(value), 9))

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

    def collect(self) -> Iterator[Metric]:
        for metric in GAUGES:
            if metric in self._families:
                yield self._families[metric]

    def text(self) -> str:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry).decode()
