"""Tell Astraeus how far your workload got: its step, and optionally its loss and checkpoint.

Dependency-free and one file: the process executor puts it on the worker's PYTHONPATH; copy it
into an image for other executors. Without Astraeus (no ASTRAEUS_PROGRESS_FILE) it does nothing.

    import astraeus_progress
    for step in range(steps):
        ...
        astraeus_progress.report(step, loss=loss.item())

The agent reads the file every few seconds: a growing step keeps the worker from being found
stalled and measures its pace against the gang's (stragglers). From a shell,
``echo 120 > "$ASTRAEUS_PROGRESS_FILE"`` says the same as ``report(120)``; so does appending a
line a step (``echo 120 >> "$ASTRAEUS_PROGRESS_FILE"``): the last complete line counts. Once a
worker reports steps, only a new step is progress (its output alone no longer is).

With a trainer, a callback reports for you (each imports its trainer when first named, so this
file imports without either):

    from astraeus_progress import HuggingFaceCallback      # transformers.Trainer
    trainer = Trainer(..., callbacks=[HuggingFaceCallback()])

    from astraeus_progress import LightningCallback        # lightning / pytorch_lightning
    trainer = L.Trainer(..., callbacks=[LightningCallback()])

They report the trainer's global step, the last loss logged and the step of the last saved
checkpoint, at most once a second (a checkpoint at once).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["Reporter", "report"]  # and the callbacks, made when named (below)


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


class Reporter:
    """What the trainer callbacks share: the last loss and checkpoint, and a report at most
    every ``every`` seconds (a new checkpoint is reported at once)."""

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.loss: float | None = None
        self.checkpoint_step: int | None = None
        self._last: float | None = None

    def step(self, step: int, loss: Any = None) -> None:
        if loss is not None:
            self.loss = _number(loss)
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every:
            return
        self._last = now
        report(step, loss=self.loss, checkpoint_step=self.checkpoint_step)

    def checkpoint(self, step: int) -> None:
        self.checkpoint_step = int(step)
        self._last = time.monotonic()
        report(step, loss=self.loss, checkpoint_step=self.checkpoint_step)


def _number(value: Any) -> float | None:
    """A loss as a float: a number, a tensor (``.item()``), or a dict with ``loss``."""
    if isinstance(value, dict):
        value = value.get("loss")
    if value is None:
        return None
    item = getattr(value, "item", None)
    try:
        return float(item() if callable(item) else value)
    except (TypeError, ValueError):
        return None


def _hugging_face_callback() -> type:
    from transformers import TrainerCallback  # imported when named: a dependency only then

    class HuggingFaceCallback(TrainerCallback):  # type: ignore[misc,unused-ignore]
        """Reports a ``transformers.Trainer``'s progress to Astraeus."""

        def __init__(self, every: float = 1.0) -> None:
            self.reporter = Reporter(every)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.step(state.global_step)

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if logs and logs.get("loss") is not None:
                self.reporter.loss = _number(logs["loss"])

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.checkpoint(state.global_step)

    return HuggingFaceCallback


def _lightning_callback() -> type:
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:  # the older package name
        from pytorch_lightning.callbacks import Callback  # type: ignore[assignment,unused-ignore]

    class LightningCallback(Callback):  # type: ignore[misc,unused-ignore]
        """Reports a Lightning ``Trainer``'s progress to Astraeus."""

        def __init__(self, every: float = 1.0) -> None:
            super().__init__()
            self.reporter = Reporter(every)

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.reporter.step(trainer.global_step, outputs)

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
            self.reporter.checkpoint(trainer.global_step)

    return LightningCallback


_CALLBACKS = {
    "HuggingFaceCallback": _hugging_face_callback,
    "LightningCallback": _lightning_callback,
}
_made: dict[str, type] = {}


def __getattr__(name: str) -> type:
    """``HuggingFaceCallback`` and ``LightningCallback``, made when first named (their trainer
    must be installed then; ImportError otherwise)."""
    if name not in _CALLBACKS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _made:
        _made[name] = _CALLBACKS[name]()
    return _made[name]
