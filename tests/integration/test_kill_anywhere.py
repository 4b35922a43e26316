"""SIGKILL at any moment of a training run, then the same command again: the same final weights
and history as an uninterrupted run.

SIGKILL cannot be caught, so nothing is saved on the way out: what makes this work is that
every file is replaced atomically (a kill leaves the old file or the new one, and a temporary
file nobody reads), ``state.json`` is written after ``last.keras`` (a kill between the two is
recognised by the optimizer step the weights carry), the lock of the dead process is taken
over, and data order and augmentation are functions of ``(seed, epoch, position)``.

The kills land where files change, through the crash points of :mod:`brats_seg.files`
(``BRATS_SEG_CRASH_AT=<file>:<n>[:after]``: the process SIGKILLs itself when the n-th write of
that file is complete but not yet in place, or just after), and at a timed moment inside an
epoch. One run is killed five times in a row, each restart resuming the previous one's
leftovers, and then finishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _command(tmp_path: Path, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        "resolution=tiny",
        "data=synthetic",
        f"data.root={tmp_path / 'synthetic'}",
        "data.synthetic_cases=8",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.num_workers=1",
        "model.depth=2",
        "model.base_filters=4",
        "trainer.epochs=3",
        "trainer.batch_size=1",
        "backend=cpu_onednn",
        "tracking=none",
        f"run_dir={run_dir}",
    ]


def _run(tmp_path: Path, run_dir: Path, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("BRATS_SEG_CRASH_AT", None)
    if crash_at:
        env["BRATS_SEG_CRASH_AT"] = crash_at
    return subprocess.run(
        _command(tmp_path, run_dir), cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env
    )


def _kill_mid_epoch(tmp_path: Path, run_dir: Path, epoch: int, delay_s: float) -> str:
    """Start the command, SIGKILL it ``delay_s`` after epoch ``epoch`` starts; its output."""
    proc = subprocess.Popen(
        _command(tmp_path, run_dir),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if f"epoch {epoch}/3: training from step" in line:
            break
    time.sleep(delay_s)
    proc.send_signal(signal.SIGKILL)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(lines)[-3000:] + out[-2000:]
    return "".join(lines) + out


def _weights(run_dir: Path) -> list[np.ndarray]:
    import keras

    import brats_seg.model.unet3d
    import brats_seg.training.losses  # noqa: F401

    model = keras.models.load_model(run_dir / "checkpoints" / "last.keras", compile=True)
    return model.get_weights() + [v.numpy() for v in model.optimizer.variables]


def _leftovers(run_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob(".tmp-*"))


@pytest.mark.slow
def test_sigkill_anywhere_then_the_same_command_ends_as_an_uninterrupted_run(tmp_path):
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    done = _run(tmp_path, full_dir)  # also prepares the data both runs share
    assert done.returncode == 0, done.stderr[-3000:]

    # 1. while the first epoch's best.keras is written (complete, not yet in place): nothing saved yet
    killed = _run(tmp_path, cut_dir, "best.keras:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert not (cut_dir / "checkpoints" / "best.keras").exists() and not (cut_dir / "state.json").exists()
    # 2. the restart: the first epoch again, killed between state.json and the first last.keras
    killed = _run(tmp_path, cut_dir, "last.keras:1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert json.loads((cut_dir / "state.json").read_text())["epoch"] == 1
    assert not (cut_dir / "checkpoints" / "last.keras").exists()
    # 3. the next restart starts over; killed between epoch 2's state.json and its last.keras (the state one ahead)
    killed = _run(tmp_path, cut_dir, "last.keras:2")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "taking over the lock" in killed.stdout + killed.stderr  # the dead process's lock
    assert "starting from the beginning" in killed.stdout + killed.stderr
    assert json.loads((cut_dir / "state.json").read_text())["epoch"] == 2
    # 4. the state is rolled back to epoch 1; epoch 2 again, then killed inside epoch 3 at a timed moment
    output = _kill_mid_epoch(tmp_path, cut_dir, epoch=3, delay_s=0.5)
    assert "one save ahead of last.keras" in output and "epoch 2/3: training from step 1" in output
    # 5. killed while epoch 3's history.csv is written (state.json and last.keras in place). A resume
    # first rewrites history.csv from state.json (write 1); epoch 3's is the next one, unless the timed
    # kill landed after epoch 3 was saved (a fast CPU), where write 1 is already epoch 3's.
    after_timed_kill = json.loads((cut_dir / "state.json").read_text())["epoch"]
    assert after_timed_kill in (2, 3)
    killed = _run(tmp_path, cut_dir, f"history.csv:{2 if after_timed_kill == 2 else 1}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert json.loads((cut_dir / "state.json").read_text())["epoch"] == 3

    again = _run(tmp_path, cut_dir)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _leftovers(cut_dir) == []  # the killed writers' temporaries, removed under the lock
    for a, b in zip(_weights(full_dir), _weights(cut_dir), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    full_state = json.loads((full_dir / "state.json").read_text())
    cut_state = json.loads((cut_dir / "state.json").read_text())
    assert [h["epoch"] for h in cut_state["history"]] == [1, 2, 3]
    assert cut_state["best_epoch"] == full_state["best_epoch"]
    for a, b in zip(full_state["history"], cut_state["history"], strict=True):
        for key in ("loss", "dice_mean", "val_dice_mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
    assert (cut_dir / "history.csv").read_text().count("\n") == 4  # header + three epochs
    assert not (cut_dir / ".lock").exists()
