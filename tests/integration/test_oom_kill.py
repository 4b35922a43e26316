"""A training run killed by the kernel's out-of-memory killer, then the same command: its log names
the OOM killer and the settings predicted to fit, and it trains to the end.

The run trains in a memory cgroup of its own, created for the test. Data preparation and the
model build run without a limit; when the first training step starts, the cgroup's limit is
set to the process's anonymous memory then plus 70% of the plan's predicted peak. The planner
is calibrated within about 12% of the measured peak (here it measured 91% of the prediction),
so the step needs about 170 MB more than the limit allows and the kernel kills the process in
it, with SIGKILL: nothing of the dying process runs. The lock it leaves records the cgroup and
its ``oom_kill`` count, so the next start (here outside the cgroup, without a limit) can tell
what happened; and 70% of the prediction leaves room for a setting the planner can fit
(``trainer.batch_size=1`` with ``lms=auto``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import new_memory_cgroup

REPO = Path(__file__).resolve().parents[2]
LIMIT_SHARE = 0.7  # of the predicted peak, above the anonymous memory at the first step


def _command(tmp_path: Path) -> list[str]:
    return [
        sys.executable,
        str(REPO / "train.py"),
        "resolution=half",
        "data=synthetic",
        f"data.root={tmp_path / 'synthetic'}",
        "data.synthetic_cases=4",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.num_workers=1",
        "model.depth=2",
        "model.base_filters=4",
        "trainer.epochs=1",
        "trainer.batch_size=2",
        "backend=cpu_onednn",
        "tracking=none",
        f"run_dir={tmp_path / 'run'}",
    ]


def _anon_bytes(cgroup: Path) -> int:
    """The cgroup's anonymous memory (what no page-cache reclaim can give back)."""
    stat = dict(line.split() for line in (cgroup / "memory.stat").read_text().splitlines())
    return int(stat["total_rss"] if "total_rss" in stat else stat["anon"])


def _set_limit(cgroup: Path, nbytes: int) -> None:
    (cgroup / ("memory.limit_in_bytes" if (cgroup / "memory.limit_in_bytes").exists() else "memory.max")).write_text(
        str(nbytes)
    )


def _oom_kills(cgroup: Path) -> int:
    text = (
        cgroup / ("memory.oom_control" if (cgroup / "memory.oom_control").exists() else "memory.events")
    ).read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("oom_kill ")))


@pytest.mark.slow
def test_a_run_killed_by_the_oom_killer_is_named_on_the_next_start_which_trains_to_the_end(tmp_path):
    cgroup = new_memory_cgroup(f"brats_seg_oom_test_{os.getpid()}")
    proc = None
    try:
        proc = subprocess.Popen(
            _command(tmp_path),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            preexec_fn=lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())),
        )  # in it from the start
        lines, predicted = [], None
        for line in proc.stdout:
            lines.append(line)
            if match := re.search(r"Memory plan: predicted peak ([0-9.]+) GB", line):
                predicted = float(match.group(1)) * 1e9
            if "epoch 1/1: training from step 1" in line:
                assert predicted, "".join(lines)[-3000:]
                _set_limit(cgroup, int(_anon_bytes(cgroup) + LIMIT_SHARE * predicted))
                break
        first = "".join(lines) + proc.communicate(timeout=600)[0]
        assert proc.returncode == -signal.SIGKILL and _oom_kills(cgroup) >= 1, (
            f"not killed by the OOM killer (exit {proc.returncode}): {first[-3000:]}"
        )
        assert (tmp_path / "run" / ".lock").exists()  # left behind, with its record

        second = subprocess.run(
            _command(tmp_path),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        log = second.stdout + second.stderr
        assert second.returncode == 0, log[-3000:]
        diagnosis = next((line for line in log.splitlines() if "the previous run (PID " in line), "")
        assert f"was killed by the kernel's out-of-memory killer (memory cgroup {cgroup}" in diagnosis, log[-3000:]
        assert "in training epoch 1" in diagnosis and "The plan predicted a peak of" in diagnosis
        assert "Memory available to the run: " in diagnosis and f"memory cgroup {cgroup}: limit " in diagnosis
        assert re.search(r"Settings predicted to fit [0-9.]+ GB \(.*\): `[^`]*lms\.limit=[0-9.]+[MG]B`", diagnosis), (
            diagnosis
        )
        assert "best val Dice" in log and (tmp_path / "run" / "checkpoints" / "last.keras").is_file()
        assert not (tmp_path / "run" / ".lock").exists()
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        cgroup.rmdir()
