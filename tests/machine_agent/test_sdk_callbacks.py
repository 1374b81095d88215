"""The progress SDK's trainer callbacks (issue 20): dependency-free until named, and what they
write is what the agent reads (step, loss, checkpoint step)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from agent.metrics import ProgressReport, read_progress

SDK = Path(__file__).resolve().parents[2] / "agent" / "sdk"


@pytest.fixture
def sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("ASTRAEUS_PROGRESS_FILE", str(tmp_path / "progress"))
    monkeypatch.syspath_prepend(str(SDK))
    module = importlib.import_module("astraeus_progress")
    yield module
    sys.modules.pop("astraeus_progress", None)


def written(tmp_path: Path) -> ProgressReport | None:
    return read_progress(tmp_path / "progress")


def test_the_sdk_imports_without_any_trainer() -> None:
    # A clean interpreter with only the SDK on its path: the callbacks are named, not imported.
    code = (
        "import sys, astraeus_progress\n"
        "assert 'transformers' not in sys.modules and 'lightning' not in sys.modules\n"
        "assert astraeus_progress.Reporter and astraeus_progress.report\n"
        "try:\n"
        "    astraeus_progress.NoSuchThing\n"
        "except AttributeError:\n"
        "    print('ok')\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(SDK)}
    out = subprocess.run(
        [sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout == "ok\n"


class Tensor:
    """What a trainer hands over as a loss: something with ``.item()``."""

    def __init__(self, value: float) -> None:
        self.value = value

    def item(self) -> float:
        return self.value


def test_the_reporter_writes_steps_at_most_once_a_second_and_checkpoints_at_once(
    sdk: Any, tmp_path: Path
) -> None:
    reporter = sdk.Reporter(every=3600)
    reporter.step(1, Tensor(2.5))
    assert written(tmp_path) == ProgressReport(step=1, loss=2.5)
    reporter.step(2, {"loss": Tensor(2.0)})  # within the hour: kept, not written
    assert written(tmp_path) == ProgressReport(step=1, loss=2.5)
    reporter.checkpoint(2)
    assert written(tmp_path) == ProgressReport(step=2, loss=2.0, checkpoint_step=2)
    every_time = sdk.Reporter(every=0)
    every_time.step(3, "not a number")
    assert written(tmp_path) == ProgressReport(step=3)


def test_lightning_reports_its_steps_loss_and_checkpoints(sdk: Any, tmp_path: Path) -> None:
    lightning = pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")

    class Tiny(lightning.LightningModule):  # type: ignore[misc,name-defined,unused-ignore]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            (x,) = batch
            return self.layer(x).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(12, 4)), 4)
    trainer = lightning.Trainer(
        max_epochs=2,
        accelerator="cpu",
        callbacks=[sdk.LightningCallback(every=0)],
        default_root_dir=str(tmp_path / "run"),
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(Tiny(), data)
    report = written(tmp_path)
    assert report is not None
    assert report.step == 6  # 3 batches, 2 epochs
    assert report.loss is not None and report.loss >= 0
    assert report.checkpoint_step == 6  # Lightning saves at the end of the fit


def test_hugging_face_reports_its_steps_loss_and_checkpoints(sdk: Any, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    callback = sdk.HuggingFaceCallback(every=0)
    assert isinstance(callback, transformers.TrainerCallback)
    state = transformers.TrainerState()
    control = transformers.TrainerControl()
    state.global_step = 10
    callback.on_log(None, state, control, logs={"loss": 1.25})
    callback.on_step_end(None, state, control)
    assert written(tmp_path) == ProgressReport(step=10, loss=1.25)
    callback.on_save(None, state, control)
    assert written(tmp_path) == ProgressReport(step=10, loss=1.25, checkpoint_step=10)
