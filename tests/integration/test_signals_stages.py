"""SIGTERM, SIGINT and SIGKILL during preparation, evaluation and prediction, then the same command.

Each entry point runs in a subprocess of its own session (so a SIGINT can be sent to its whole
process group, as a terminal's Ctrl-C is). A signal lands once the stage has visibly started
(its first cache entry is in place); in evaluation and prediction, which end within seconds, at a
chosen write where the command stopped itself (a ``:stop`` crash point), so a loaded machine cannot
make the signal come after the stage ended; then:

* SIGTERM/SIGINT: exit status 75, a message naming the stage and how far it got, no
  traceback, no temporary or half-written file (every .nii.gz loads, every .json parses,
  every .npy loads), no lock, and no process left of the command (its preparation workers);
* SIGKILL (a crash point of :mod:`brats_seg.files`, or a random moment): nothing to say, but the
  next run takes over the lock and removes the dead writers' temporaries;

and after each chain of interruptions the same command ends as an uninterrupted run does:
byte-identical cache entries and metrics.csv/summary.json, and equal masks.

The dataset is eight small cases (the session's synthetic cases at 2 mm, so preparing one takes
a fraction of a second), and the model one tiny run trained for two steps, shared by the module.
Overlays are off (their reuse is tested in tests/unit/test_resume_eval_predict.py).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import psutil
import pytest

from brats_seg.config import DataConfig
from brats_seg.data.dataset import dataset_cache_dir
from brats_seg.signals import Interrupted, report_progress, stop_on_signals
from tests.unit.test_resume_eval_predict import write_small_dataset

REPO = Path(__file__).resolve().parents[2]
N_CASES = 8
EXIT_STOPPED = 75
BACKEND = ["backend=cpu_onednn", "backend.intra_op_threads=1", "backend.inter_op_threads=1"]  # 2 cores shared
ENV = {
    **os.environ,
    "TF_CPP_MIN_LOG_LEVEL": "2",
    "OMP_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "-1",
    "PYTHONUNBUFFERED": "1",
}


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(REPO / script), *args]


def _run(command: list[str], cwd: Path, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**ENV, **({"BRATS_SEG_CRASH_AT": crash_at} if crash_at else {})}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _interrupt(
    command: list[str], cwd: Path, started, sig: int, group: bool = False, delay_s: float = 0.0, stop_at: str = ""
) -> tuple[subprocess.CompletedProcess, list[psutil.Process]]:
    """Run ``command``; once ``started()`` is true (polled), wait ``delay_s`` and send ``sig`` (to the
    whole process group if ``group``). Returns the result and the processes it had then.

    With ``stop_at`` (a crash point of :mod:`brats_seg.files` ending in ``:stop``; ``started`` is
    then ``None``: the stop is the start) the command stops itself at that write, and ``sig`` is sent before SIGCONT: the
    signal lands at that moment on any machine. Polling cannot promise that for a stage that ends
    within a few seconds: CI on a loaded 2-vCPU machine once polled so late that prediction had
    finished all eight cases and exited 0 before the signal was sent."""
    env = {**ENV, **({"BRATS_SEG_CRASH_AT": stop_at} if stop_at else {})}
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert (started is None) == bool(stop_at), "either a condition to poll or a write to stop at"
    if stop_at:
        started = lambda: psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED  # noqa: E731
    deadline = time.monotonic() + 300
    while not started():
        if proc.poll() is not None or time.monotonic() > deadline:
            out, err = proc.communicate()
            pytest.fail(
                f"{command[1]} ended (status {proc.returncode}) before the signal could be sent:\n{(out + err)[-3000:]}"
            )
        time.sleep(0.02)
    time.sleep(delay_s)
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    send = (lambda s: os.killpg(proc.pid, s)) if group else (lambda s: os.kill(proc.pid, s))
    send(sig)
    if stop_at:
        send(signal.SIGCONT)  # the pending signal is delivered as it resumes
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(command, proc.returncode, out, err), family


def _assert_stopped(result: subprocess.CompletedProcess, family: list[psutil.Process], sig: int, stage: str) -> None:
    """Exit 75 with the stage's message, no traceback, and no process of the command left."""
    text = result.stdout + result.stderr
    assert result.returncode == EXIT_STOPPED, text[-3000:]
    said = [
        line
        for line in result.stderr.splitlines()
        if line.startswith(f"{signal.Signals(sig).name}: {stage} stopped after ")
    ]
    assert len(said) == 1, text[-3000:]
    assert "Re-run the same command to continue" in said[0] and "Traceback" not in text, text[-3000:]
    _assert_no_process_left(family)


def _assert_no_process_left(family: list[psutil.Process]) -> None:
    _, alive = psutil.wait_procs(family, timeout=15)
    assert not alive, f"processes of the command still running: {[(p.pid, p.cmdline()) for p in alive]}"


def _assert_nothing_half_written(folder: Path) -> None:
    """No temporary name, no lock; every file a later step reads loads."""
    leftovers = [str(p.relative_to(folder)) for p in folder.rglob("*") if p.name.startswith((".tmp-", ".old-"))]
    assert leftovers == [], leftovers
    assert list(folder.rglob(".lock")) == []
    for p in folder.rglob("*.json"):
        json.loads(p.read_text())
    for p in folder.rglob("*.npy"):
        np.load(p)
    for p in folder.rglob("*.nii.gz"):
        np.asarray(nib.load(p).dataobj)


def _complete(folder: Path, pattern: str) -> int:
    return sum(1 for p in folder.glob(pattern) if not any(part.startswith(".") for part in p.relative_to(folder).parts))


def _same_files(a: Path, b: Path, pattern: str) -> None:
    names = sorted(p.relative_to(a) for p in a.glob(pattern))
    assert names and names == sorted(p.relative_to(b) for p in b.glob(pattern))
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _same_masks(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.glob("*.nii.gz"))
    assert names and names == sorted(p.name for p in b.glob("*.nii.gz"))
    for name in names:
        x, y = nib.load(a / name), nib.load(b / name)
        np.testing.assert_array_equal(np.asarray(x.dataobj), np.asarray(y.dataobj), err_msg=name)
        np.testing.assert_array_equal(x.affine, y.affine)


# ---------------------------------------------------------------------------------------
# The module's dataset and run
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world(synthetic_root, tmp_path_factory):
    """The dataset, its cache prepared by training, and a tiny trained run (one step on each of two cases)."""
    base = tmp_path_factory.mktemp("signals")
    root = base / "data"
    write_small_dataset(synthetic_root["brats2021"], root, N_CASES)
    run_dir = base / "run"
    trained = _run(
        _command(
            "train.py",
            "data=brats2021",
            f"data.root={root}",
            f"data.cache_dir={base / 'cache'}",
            "data.num_workers=1",
            "model.depth=2",
            "model.base_filters=4",
            "trainer.epochs=1",
            "trainer.batch_size=1",
            "trainer.steps_per_epoch=2",
            "tracking=none",
            f"run_dir={run_dir}",
            "resolution=tiny",
            *BACKEND,
        ),
        base,
    )
    assert trained.returncode == 0, (trained.stdout + trained.stderr)[-3000:]
    return base, root, run_dir


# ---------------------------------------------------------------------------------------
# The message (in-process, fast)
# ---------------------------------------------------------------------------------------


def test_the_interrupted_message_says_how_far_the_stage_got_and_a_second_signal_does_not_cut_the_cleanup():
    cleaned = []
    with pytest.raises(Interrupted) as stopped:
        with stop_on_signals("evaluation"):
            report_progress("3 of 8 cases")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                os.kill(os.getpid(), signal.SIGINT)  # pressed again while unwinding: logged, ignored
                cleaned.append(True)
    assert cleaned == [True] and stopped.value.stage == "evaluation" and stopped.value.progress == "3 of 8 cases"
    assert str(stopped.value).startswith("SIGTERM: evaluation stopped after 3 of 8 cases; what it finished is kept")
    assert str(Interrupted("SIGINT", "prediction")).startswith("SIGINT: prediction stopped; ")


# ---------------------------------------------------------------------------------------
# Preparation
# ---------------------------------------------------------------------------------------


def _prepare_command(root: Path, cache_dir: Path, workers: int) -> list[str]:
    return _command(
        "scripts/prepare_data.py",
        "data=brats2021",
        f"data.root={root}",
        f"data.cache_dir={cache_dir}",
        f"data.num_workers={workers}",
        "resolution=tiny",
    )


@pytest.mark.slow
def test_signals_and_kills_during_preparation_then_the_same_command_gives_the_same_cache(world, tmp_path):
    base, root, _ = world
    cache_dir = tmp_path / "cache"
    entries = dataset_cache_dir(DataConfig(name="brats2021", root=str(root), cache_dir=str(cache_dir))) / "tiny"
    reference = dataset_cache_dir(DataConfig(name="brats2021", root=str(root), cache_dir=str(base / "cache"))) / "tiny"
    command = _prepare_command(root, cache_dir, workers=2)

    def more_than(n: int):
        return lambda: _complete(entries, "*/meta.json") > n

    # SIGTERM to the command: the pool stops, the entries done stay
    result, family = _interrupt(command, tmp_path, more_than(0), signal.SIGTERM)
    assert len(family) >= 3  # the command, its two workers (and the resource tracker)
    _assert_stopped(result, family, signal.SIGTERM, "preparation")
    assert "cases prepared;" in result.stderr
    done = _complete(entries, "*/meta.json")
    assert 1 <= done < N_CASES
    _assert_nothing_half_written(cache_dir)

    # Ctrl-C at a terminal: SIGINT to the whole process group; the workers leave it to the parent
    result, family = _interrupt(command, tmp_path, more_than(done), signal.SIGINT, group=True)
    _assert_stopped(result, family, signal.SIGINT, "preparation")
    done = _complete(entries, "*/meta.json")
    assert done < N_CASES
    _assert_nothing_half_written(cache_dir)

    # SIGKILL while the next entry is renamed into place (in-process preparation), then at a random
    # moment with the workers running: they follow their parent
    killed = _run(_prepare_command(root, cache_dir, workers=1), tmp_path, crash_at="BraTS2021_*:1")
    assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
    assert _complete(entries, "*/meta.json") == done and list(entries.glob(".tmp-*"))  # the entry left unfinished
    result, family = _interrupt(command, tmp_path, more_than(done), signal.SIGKILL, delay_s=random.uniform(0, 0.2))
    assert result.returncode == -signal.SIGKILL
    _assert_no_process_left(family)

    again = _run(command, tmp_path)
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert f"prepared {N_CASES} cases" in again.stdout and "taking over the lock" in again.stdout + again.stderr
    _assert_nothing_half_written(cache_dir)
    for pattern in ("*/image.npy", "*/regions.npy", "*/meta.json"):  # as the uninterrupted preparation's
        _same_files(entries, reference, pattern)


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def evaluated(world, tmp_path_factory):
    """The uninterrupted evaluation's files (split=all), kept aside; the run's eval/ is left empty."""
    base, _, run_dir = world
    done = _run(
        _command("scripts/evaluate.py", f"run_dir={run_dir}", "split=all", "evaluate.overlays=false", *BACKEND), base
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    kept = tmp_path_factory.mktemp("evaluated") / "all"
    shutil.move(run_dir / "eval" / "all", kept)
    return kept


@pytest.mark.slow
def test_signals_and_kills_during_evaluation_then_the_same_command_gives_the_same_metrics(world, evaluated):
    base, _, run_dir = world
    out = run_dir / "eval" / "all"
    command = _command("scripts/evaluate.py", f"run_dir={run_dir}", "split=all", "evaluate.overlays=false", *BACKEND)

    def more_than(n: int):
        return lambda: _complete(out / "cases", "*.json") > n

    try:
        # SIGTERM once the second case's record is in place (a chosen write: polling can miss a
        # stage that ends within seconds; see _interrupt)
        result, family = _interrupt(command, base, None, signal.SIGTERM, stop_at="BraTS2021_*.json:2:after:stop")
        _assert_stopped(result, family, signal.SIGTERM, "evaluation")
        assert f" of {N_CASES} cases;" in result.stderr
        _assert_nothing_half_written(run_dir)
        assert _complete(out / "cases", "*.json") == 2 and not (out / "metrics.csv").exists()

        # Ctrl-C to the process group while the next run's second record is written: the fourth
        # case's temporary record is removed, the third's kept
        result, family = _interrupt(
            command, base, None, signal.SIGINT, group=True, stop_at="BraTS2021_*.json:2:before:stop"
        )
        _assert_stopped(result, family, signal.SIGINT, "evaluation")
        _assert_nothing_half_written(run_dir)
        done = _complete(out / "cases", "*.json")
        assert done == 3

        # SIGKILL just before the next case's record is in place, then at a random moment
        killed = _run(command, base, crash_at="BraTS2021_*.json:1")
        assert killed.returncode == -signal.SIGKILL, (killed.stdout + killed.stderr)[-3000:]
        assert _complete(out / "cases", "*.json") == done
        result, family = _interrupt(command, base, more_than(done), signal.SIGKILL, delay_s=random.uniform(0, 0.2))
        assert result.returncode == -signal.SIGKILL
        done = _complete(out / "cases", "*.json")
        assert done < N_CASES, "the evaluation ended before the kill; nothing was tested"

        again = _run(command, base)
        text = again.stdout + again.stderr
        assert again.returncode == 0, text[-3000:]
        assert f"{done} of {N_CASES} cases were evaluated before" in text and "taking over the lock" in text
        _assert_nothing_half_written(run_dir)
        _same_files(out, evaluated, "*.csv")
        _same_files(out, evaluated, "summary.json")
        _same_masks(out / "predictions", evaluated / "predictions")
    finally:
        shutil.rmtree(out, ignore_errors=True)


# ---------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------


def _recorded(out: Path) -> int:
    """The cases ``predict.json`` records as done; 0 before the first record is written."""
    path = out / "predict.json"
    return len(json.loads(path.read_text())["cases"]) if path.exists() else 0


@pytest.mark.slow
def test_signals_during_prediction_then_the_same_command_writes_the_same_masks(world, tmp_path):
    _base, root, run_dir = world

    def command(output: Path) -> list[str]:
        return _command(
            "scripts/predict.py",
            f"run_dir={run_dir}",
            f"input={root}",
            f"output={output}",
            "evaluate.overlays=false",
            *BACKEND,
        )

    reference = tmp_path / "reference"
    done = _run(command(reference), tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]

    # The signals land at chosen writes (the stage ends within seconds: polling could miss it).
    # SIGTERM between the second mask and its record: that mask is kept but not trusted
    out = tmp_path / "out"
    result, family = _interrupt(command(out), tmp_path, None, signal.SIGTERM, stop_at="BraTS2021_*.nii.gz:2:after:stop")
    _assert_stopped(result, family, signal.SIGTERM, "prediction")
    assert "prediction stopped after 1 of 8 cases" in result.stderr
    _assert_nothing_half_written(out)
    assert (_complete(out, "*.nii.gz"), _recorded(out)) == (2, 1)

    # Ctrl-C to the process group while the third mask of the next run is written (the second
    # case again, then the third, then the fourth's temporary file): no fourth mask, nothing left of it
    result, family = _interrupt(
        command(out), tmp_path, None, signal.SIGINT, group=True, stop_at="BraTS2021_*.nii.gz:3:before:stop"
    )
    _assert_stopped(result, family, signal.SIGINT, "prediction")
    _assert_nothing_half_written(out)
    assert (_complete(out, "*.nii.gz"), _recorded(out)) == (3, 3)

    again = _run(command(out), tmp_path)
    text = again.stdout + again.stderr
    assert again.returncode == 0, text[-3000:]
    assert f"3 of {N_CASES} cases were predicted before by this model" in text
    _assert_nothing_half_written(out)
    _same_masks(out, reference)
