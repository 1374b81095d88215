"""Tell Astraeus how far your workload got: its step, and optionally its loss and checkpoint.

Dependency-free and one file: the process executor puts it on the worker's PYTHONPATH; copy it
into an image for other executors. Without Astraeus (no ASTRAEUS_PROGRESS_FILE) it does nothing.

    import astraeus_progress
    for step in range(steps):
        ...
        astraeus_progress.report(step, loss=loss.item())

The agent reads the file every few seconds: a growing step keeps the worker from being found
stalled and measures its pace against the gang's (stragglers). From a shell,
``echo 120 > "$ASTRAEUS_PROGRESS_FILE"`` says the same as ``report(120)``.
"""

from __future__ import annotations

import json
import os

__all__ = ["report"]


def report(
    step: int,
    *,
    loss: float | None = None,
    checkpoint_step: int | None = None,
    gpu_utilization: float | None = None,
) -> None:
    """Write the workload's progress where its agent reads it (the whole file, atomically).

    ``gpu_utilization`` (0 to 1) is for simulated GPUs only: it is what they show as busy.
    """
    path = os.environ.get("ASTRAEUS_PROGRESS_FILE")
    if not path:
        return
    report_: dict[str, float] = {"step": int(step)}
    if loss is not None:
        report_["loss"] = float(loss)
    if checkpoint_step is not None:
        report_["checkpoint_step"] = int(checkpoint_step)
    if gpu_utilization is not None:
        report_["gpu_utilization"] = min(max(float(gpu_utilization), 0.0), 1.0)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        json.dump(report_, f)
    os.replace(partial, path)
