"""Locks on a run folder, an evaluation and a cache entry being built: a second training or
evaluation is refused with the holder's PID, host and command, a second builder of a cache entry
waits for the first; a lock left by a dead process is taken over."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from brats_seg.locks import LockedError, hold_lock

REPO = Path(__file__).resolve().parents[2]
HOLDER = (
    "import sys, time; sys.path.insert(0, sys.argv[2]); from brats_seg.locks import hold_lock\n"
    "with hold_lock(sys.argv[1], 'run folder'):\n    print('held', flush=True); time.sleep(120)"
)


def _hold_in_another_process(folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder), str(REPO)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_naming_the_holder(tmp_path):
    holder = _hold_in_another_process(tmp_path / "run")
    try:
        with pytest.raises(LockedError) as err:
            with hold_lock(tmp_path / "run", "run folder"):
                pass
        msg = str(err.value)
        assert f"PID {holder.pid} on this host" in msg and "wait for it to finish or stop it" in msg
        assert "(-c " in msg and "\n" not in msg  # its command (python -c ...), on one line
    finally:
        holder.terminate()
        holder.wait(timeout=30)


def test_the_lock_is_released_and_a_dead_holders_lock_taken_over(tmp_path, caplog):
    with hold_lock(tmp_path / "run", "run folder") as lock:
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert not lock.exists()  # released

    holder = _hold_in_another_process(tmp_path / "run")
    holder.send_signal(signal.SIGKILL)  # no chance to release it
    holder.wait(timeout=30)
    assert lock.exists()
    with caplog.at_level(logging.WARNING, logger="brats_seg.locks"):
        with hold_lock(tmp_path / "run", "run folder"):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    assert f"taking over the lock of PID {holder.pid}" in caplog.text


def test_a_lock_from_another_host_is_refused_with_the_file_to_delete(tmp_path):
    (tmp_path / "run").mkdir()
    lock = tmp_path / "run" / ".lock"
    lock.write_text(
        json.dumps(
            {
                "pid": 1,
                "host": "node17." + socket.gethostname(),
                "since": "2026-11-25 01:00:00",
                "command": "train.py run_dir=run",
            }
        )
    )
    with pytest.raises(LockedError, match=rf"PID 1 on host node17\..*train\.py run_dir=run.*delete {lock}"):
        with hold_lock(tmp_path / "run", "run folder"):
            pass


def test_a_reused_pid_is_not_taken_for_the_holder(tmp_path, caplog):
    """A dead holder's PID now belongs to another process (here: this one's parent): the start
    time recorded with it tells them apart, so the lock is stale."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").write_text(
        json.dumps({"pid": os.getppid(), "pid_start": 1.0, "host": socket.gethostname(), "since": "long ago"})
    )
    with caplog.at_level(logging.WARNING, logger="brats_seg.locks"):
        with hold_lock(tmp_path / "run", "run folder"):
            pass
    assert "taking over the lock" in caplog.text


def test_building_a_cache_entry_waits_for_the_job_building_it(synthetic_root, tmp_path, caplog):
    """The jobs of a sweep start together and share a cache entry: the second waits for the
    first (saying whom it waits for), then builds only what is still missing."""
    from brats_seg.data.cache import prepare_cases
    from brats_seg.data.layouts import discover_cases

    cases, _ = discover_cases(synthetic_root["brats2021"], "brats2021")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER.replace("120", "3"), str(tmp_path / "cache"), str(REPO)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="brats_seg.locks"):
        _entries, errors, built = prepare_cases(
            cases[:1], tmp_path / "cache", 4.0, (48, 56, 40), num_workers=1, progress=False
        )
    assert holder.wait(timeout=30) == 0 and time.monotonic() - started > 1.0  # it waited for the holder
    assert f"cache entry {tmp_path / 'cache'} is in use by PID {holder.pid}" in caplog.text and "waiting" in caplog.text
    assert built == 1 and not errors and not (tmp_path / "cache" / ".lock").exists()
    _, _, again = prepare_cases(cases[:1], tmp_path / "cache", 4.0, (48, 56, 40), num_workers=1, progress=False)
    assert again == 0  # built: nothing to lock or rebuild


@pytest.mark.slow
def test_train_py_in_a_folder_another_training_holds_is_refused_then_a_killed_one_is_resumed(tmp_path):
    """Two train.py in one run_dir: the second exits 2 naming the first. The first, SIGKILLed
    mid-run, leaves its lock; the same command takes it over and finishes the run."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "resolution=tiny",
        "data=synthetic",
        f"data.root={tmp_path / 'synthetic'}",
        "data.synthetic_cases=5",
        f"data.cache_dir={tmp_path / 'cache'}",
        "model.depth=2",
        "model.base_filters=4",
        "trainer.batch_size=1",
        "trainer.epochs=30",
        "backend=cpu_onednn",
        "tracking=none",
        f"run_dir={run_dir}",
    ]
    first = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (run_dir / "state.json").is_file():  # a completed epoch: the lock is held
            assert first.poll() is None and time.monotonic() < deadline, "the first training did not get going"
            time.sleep(0.5)
        second = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert second.returncode == 2, second.stderr[-2000:]
        assert f"run folder {run_dir} is in use by PID {first.pid} on this host" in second.stderr
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    assert (run_dir / ".lock").exists()  # left behind by the killed run
    done = [c for c in cmd if not c.startswith("trainer.epochs=")] + ["trainer.epochs=2"]  # shortened to finish
    again = subprocess.run(done, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "taking over the lock" in again.stdout + again.stderr
    assert json.loads((run_dir / "state.json").read_text())["epoch"] >= 1 and not (run_dir / ".lock").exists()


def test_two_processes_taking_over_one_dead_lock_do_not_both_hold_it(tmp_path, monkeypatch):
    """Both read the dead holder's record; the other takes the lock over first and holds it; this
    one, judging the record it read, must not remove the live lock the other just made."""
    import brats_seg.locks as locks

    folder = tmp_path / "run"
    dead = _hold_in_another_process(folder)
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=30)
    real_is_alive, other = locks._holder_is_alive, []

    def judged_while_the_other_takes_over(holder):  # between this process's read and its takeover
        if not other:
            other.append(_hold_in_another_process(folder))  # takes the dead lock over and holds it
        return real_is_alive(holder)

    monkeypatch.setattr(locks, "_holder_is_alive", judged_while_the_other_takes_over)
    try:
        with pytest.raises(LockedError) as err:
            with hold_lock(folder, "run folder"):
                pass
        assert f"in use by PID {other[0].pid} on this host" in str(err.value)
        assert json.loads((folder / ".lock").read_text())["pid"] == other[0].pid  # its lock stands
    finally:
        for proc in other:
            proc.terminate()
            proc.wait(timeout=30)
