"""Faults while building cache entries: a full disk, running out of memory, a dead builder's leftovers.

A full disk is tried on a real size-limited tmpfs (mounted here when the process may mount,
as root in CI; skipped with the reason otherwise) with two worker processes, and by an
injected ENOSPC in this process (always): either way one DiskFullError names the entry and
the free space, the entries built before stay valid, nothing temporary is left, and the next
run builds only the missing entries.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import brats_seg.data.cache as cache
import brats_seg.data.workers as workers
from brats_seg.config import STANDARD_RESOLUTIONS
from brats_seg.data.cache import prepare_cases
from brats_seg.data.errors import DataError
from brats_seg.data.layouts import discover_cases
from brats_seg.data.prep_memory import preparation_memory_advice
from brats_seg.data.preprocess import estimate_preparation_bytes
from brats_seg.files import DiskFullError, format_bytes
from tests.conftest import TINY, mounted_tmpfs, skip_outside_ci
from tests.unit.test_resume_eval_predict import write_small_dataset

REPO = Path(__file__).resolve().parents[2]
SPACING, SHAPE = TINY.spacing_mm, tuple(TINY.shape)


@pytest.fixture(scope="module")
def cases(synthetic_root, tmp_path_factory):
    """3 labelled cases at 2 mm (a fraction of a second each to prepare; an entry is 1.2 MB as ever)."""
    root = tmp_path_factory.mktemp("small") / "brats2021"
    write_small_dataset(synthetic_root["brats2021"], root, 3)
    return discover_cases(root, "brats2021")[0]


def _prepare(cases, root: Path, num_workers: int = 1):
    return prepare_cases(cases, root, SPACING, SHAPE, num_workers=num_workers, progress=False)


def _temporaries(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith((".tmp-", ".old-")))


def _assert_valid(root: Path, case_id: str) -> None:
    meta = json.loads((root / case_id / "meta.json").read_text())
    assert meta["case_id"] == case_id
    assert np.load(root / case_id / "image.npy").shape == (*SHAPE, 4)
    assert np.load(root / case_id / "regions.npy").shape == (*SHAPE, 3)


# ---------------------------------------------------------------------------------------
# A full disk
# ---------------------------------------------------------------------------------------


def _check_disk_full_then_resume(cases, root: Path, err: DiskFullError, num_workers: int) -> None:
    message = str(err)
    assert isinstance(err, DiskFullError) and "\n" not in message
    assert str(err.path.parent) == str(root) and err.path.name in {c.case_id for c in cases}
    assert f"writing {err.path} (" in message and " free there)" in message and err.free_bytes is not None
    built = sorted(p.name for p in root.iterdir() if (p / "meta.json").is_file())
    assert 1 <= len(built) < len(cases) and err.path.name not in built
    assert (
        f"{len(built)} of the {len(cases)} cache entries are complete and kept; the next run builds only the "
        f"{len(cases) - len(built)} missing."
    ) in message  # counted from the disk, whichever worker ended first
    assert _temporaries(root) == []  # the failed entry's folder went, giving its space back
    for case_id in built:
        _assert_valid(root, case_id)
    mtimes = {c: (root / c / "meta.json").stat().st_mtime_ns for c in built}

    entries, errors, n_built = _prepare(cases, root, num_workers)
    assert errors == [] and n_built == len(cases) - len(built)  # only the missing ones
    assert [e.case_id for e in entries] == sorted(c.case_id for c in cases)
    assert {c: (root / c / "meta.json").stat().st_mtime_ns for c in built} == mtimes  # untouched
    for e in entries:
        _assert_valid(root, e.case_id)


def test_injected_enospc_names_the_entry_and_keeps_the_entries_built(cases, tmp_path, monkeypatch):
    root = tmp_path / "cache"
    real_save, saved = np.save, []

    def save(file, arr, *args, **kwargs):  # the second entry's image finds the disk full
        saved.append(file)
        if len(saved) == 3:  # entry 1: image, regions; entry 2: image
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(file, arr, *args, **kwargs)

    monkeypatch.setattr(np, "save", save)
    with pytest.raises(DiskFullError) as err:
        _prepare(cases, root)
    monkeypatch.setattr(np, "save", real_save)
    assert err.value.path == root / sorted(c.case_id for c in cases)[1]
    _check_disk_full_then_resume(cases, root, err.value, num_workers=1)


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 2 MB tmpfs (one tiny cache entry is 1.2 MB), unmounted afterwards."""
    mnt = tmp_path / "tmpfs"
    with mounted_tmpfs(mnt, "2m") as why_not:
        if why_not:
            skip_outside_ci(
                f"cannot mount a tmpfs here ({why_not}); the injected ENOSPC test covers the same path in one process"
            )
        yield mnt


def test_a_full_tmpfs_stops_the_workers_with_one_error_and_the_next_run_builds_the_rest(
    cases, small_tmpfs, monkeypatch
):
    root = small_tmpfs / "cache"
    # One entry first (1.2 of the 2 MB): neither of the other two then fits, whichever worker writes
    # first. With an empty tmpfs the outcome was a race: both workers' images fit, and the entry
    # whose regions came second failed, while the other was renamed in place or stopped just before.
    _prepare(cases[:1], root)
    # The check before writing saw room (another writer fills the disk after it): the disk fills
    # during the writes, the path this test is about.
    monkeypatch.setattr(cache, "free_bytes", lambda path: 1 << 40)
    with pytest.raises(DiskFullError) as err:
        _prepare(cases, root, num_workers=2)
    assert shutil.disk_usage(small_tmpfs).free < 1_300_000  # really full: no room for another entry
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_tmpfs)], check=True, capture_output=True)
    _check_disk_full_then_resume(cases, root, err.value, num_workers=2)


# ---------------------------------------------------------------------------------------
# What the cache will take, checked before anything is written
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["brats2021", "brats2024"])
def test_the_predicted_cache_size_is_what_preparing_writes(synthetic_root, tmp_path, layout):
    """From the cases and the grid alone (brats2024: four regions), against the blocks on disk."""
    found = discover_cases(synthetic_root[layout], layout)[0]
    predicted = cache.predict_cache_bytes(found, TINY.shape)
    prepare_cases(found, tmp_path / "cache", TINY.spacing_mm, TINY.shape, num_workers=1, progress=False)
    on_disk = cache.cache_bytes_on_disk(tmp_path / "cache")
    assert abs(predicted / on_disk - 1) < 0.05, (predicted, on_disk)
    n_regions = 4 if layout == "brats2024" else 3
    assert predicted > len(found) * int(np.prod(TINY.shape)) * (8 + n_regions)  # at least the arrays' bytes
    # the full grid, as the docs quote it: ~76 MB an entry, ~95 GB for BraTS 2021's 1,251 cases
    assert round(1251 * cache.entry_bytes((192, 224, 160)) / 1e9) == 95


def test_a_cache_that_does_not_fit_the_disk_is_refused_before_anything_is_written(cases, small_tmpfs):
    root = small_tmpfs / "cache"  # 2 MB free, three entries of 1.2 MB to build
    with pytest.raises(cache.CacheSpaceError) as err:
        _prepare(cases, root)
    need = cache.predict_cache_bytes(cases, SHAPE)
    message = str(err.value)
    assert format_bytes(need) in message and format_bytes(shutil.disk_usage(small_tmpfs).free) in message
    assert "3 case(s)" in message and "data.cache_dir=" in message and "nothing was written" in message
    assert not root.exists() and list(small_tmpfs.iterdir()) == []  # not even the folder


def test_prepare_data_refuses_a_disk_too_small_with_one_error_line_and_exit_2(cases, small_tmpfs, tmp_path):
    """The script as a user runs it: one `error:` line with the sizes, exit 2, nothing written."""
    script = Path(__file__).resolve().parents[2] / "scripts" / "prepare_data.py"
    root = cases[0].images[0].parent.parent
    command = [sys.executable, str(script), "data=brats2021", f"data.root={root}", "resolution=tiny"]
    done = subprocess.run(
        [*command, f"data.cache_dir={small_tmpfs}"], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(errors) == 1 and "the cache needs" in errors[0] and "free" in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr and list(small_tmpfs.iterdir()) == []
    fits = subprocess.run(
        [*command, f"data.cache_dir={tmp_path / 'cache'}"], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert fits.returncode == 0, fits.stderr[-2000:]
    assert "prepared 3 cases" in fits.stdout and "on disk" in fits.stdout and "(WT, TC, ET)" in fits.stdout


# ---------------------------------------------------------------------------------------
# Out of memory
# ---------------------------------------------------------------------------------------


def test_standard_resolutions_are_the_resolution_configs():
    configs = {}
    for path in (REPO / "configs" / "resolution").glob("*.yaml"):
        c = yaml.safe_load(path.read_text())
        configs[c["name"]] = (float(c["spacing_mm"]), tuple(c["shape"]))
    assert {name: (mm, shape) for name, mm, shape in STANDARD_RESOLUTIONS} == configs
    assert [mm for _, mm, _ in STANDARD_RESOLUTIONS] == sorted(mm for _, mm, _ in STANDARD_RESOLUTIONS)  # finest first


NATIVE, ZOOMS = (240, 240, 155), (1.0, 1.0, 1.0)
NEED_FULL = estimate_preparation_bytes(NATIVE, ZOOMS, 1.0, (192, 224, 160))  # ~0.48 GB
NEED_HALF = estimate_preparation_bytes(NATIVE, ZOOMS, 2.0, (96, 112, 80))


@pytest.mark.parametrize(
    "workers,available,expect,refuse",
    [
        # failed while the other workers held their cases: as many workers as the memory they had between them holds
        (4, NEED_FULL // 2, "data.num_workers=3 (about", "resolution="),
        (3, 0, "data.num_workers=2 (about", "resolution="),
        (2, NEED_FULL // 2, "data.num_workers=1 (about", "resolution="),
        # alone, and one case at 1 mm does not fit: the finest resolution whose case does
        (1, NEED_FULL // 2, f"resolution=half (about {format_bytes(NEED_HALF)} a case at 2 mm)", "data.num_workers="),
        (1, 1000, "none: no standard resolution coarser than 1 mm fits", "resolution="),
    ],
)
def test_out_of_memory_advice_is_computed_from_the_estimate(workers, available, expect, refuse):
    problem, fix = preparation_memory_advice(NATIVE, ZOOMS, 1.0, (192, 224, 160), workers, available)
    assert f"a case needs about {format_bytes(NEED_FULL)}" in problem
    assert f"{format_bytes(available)} was available" in problem and "240x240x155 voxels of 1x1x1 mm" in problem
    assert (f"(data.num_workers={workers})" in problem) == (workers > 1)
    assert expect in fix and refuse not in fix
    assert "By the estimate one more case fits" not in fix


def test_out_of_memory_with_room_by_the_estimate_points_at_a_process_limit():
    _, fix = preparation_memory_advice(NATIVE, ZOOMS, 1.0, (192, 224, 160), 1, 2 * NEED_FULL)
    assert "resolution=half" in fix and "ulimit -v" in fix


def test_a_memory_error_while_preparing_names_the_case_the_estimate_the_memory_and_what_fits(
    cases, tmp_path, monkeypatch
):
    import nibabel as nib
    import psutil

    case = cases[0]
    header = nib.load(str(case.images[0])).header
    need = estimate_preparation_bytes(header.get_data_shape(), header.get_zooms(), SPACING, SHAPE)
    available, real, failed = need // 3, psutil.virtual_memory, []

    def out_of_memory(*args, **kwargs):
        failed.append(True)
        raise MemoryError("Unable to allocate 142. MiB for an array")

    def memory():  # what is left when the allocation failed (the header checks before it see the real value)
        return SimpleNamespace(available=available, total=8 * need) if failed else real()

    monkeypatch.setattr(cache, "preprocess_case", out_of_memory)
    monkeypatch.setattr(psutil, "virtual_memory", memory)
    entries, errors, n_built = _prepare([case], tmp_path / "cache")
    assert entries == [] and n_built == 0 and len(errors) == 1
    message = str(errors[0])
    assert message.startswith(f"case {case.case_id}: out of memory preparing it at 4 mm")
    assert (
        f"a case needs about {format_bytes(need)}" in message and f"{format_bytes(available)} was available" in message
    )
    # 4 mm is the coarsest standard resolution: nothing coarser to suggest, and it says so
    assert "none: no standard resolution coarser than 4 mm fits" in message
    assert _temporaries(tmp_path / "cache") == []


# ---------------------------------------------------------------------------------------
# Leftovers of a dead builder
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_entry(cases, tmp_path_factory):
    """A cache holding the first case's entry (tests copy it)."""
    root = tmp_path_factory.mktemp("one_entry") / "cache"
    _prepare(cases[:1], root)
    return root


def _copy(one_entry: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(one_entry, tmp_path / "cache"))


def _plant_leftovers(root: Path, case_id: str) -> list[Path]:
    planted = [root / f".tmp-{case_id}-1a2b3c4d", root / f".old-{case_id}-5e6f7a8b"]
    for p in planted:
        p.mkdir(parents=True)
        (p / "image.npy").write_bytes(b"half")  # fresh: a dead builder's folder is removed at once, not after an hour
    return planted


def test_a_dead_builders_folders_are_removed_at_once_while_building(cases, one_entry, tmp_path):
    root = _copy(one_entry, tmp_path)
    planted = _plant_leftovers(root, cases[1].case_id)
    _, errors, n_built = _prepare(cases[:2], root)
    assert errors == [] and n_built == 1
    assert _temporaries(root) == [] and not any(p.exists() for p in planted)
    _assert_valid(root, cases[1].case_id)


def test_a_dead_builders_folders_are_removed_when_nothing_is_built(cases, one_entry, tmp_path):
    root = _copy(one_entry, tmp_path)
    _plant_leftovers(root, cases[0].case_id)
    _, _, n_built = _prepare(cases[:1], root)
    assert n_built == 0 and _temporaries(root) == [] and not (root / ".lock").exists()
    _assert_valid(root, cases[0].case_id)


def test_a_live_builders_folders_are_left_alone(cases, one_entry, tmp_path):
    import psutil

    root = _copy(one_entry, tmp_path)
    planted = _plant_leftovers(root, cases[1].case_id)
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (root / ".lock").write_text(
            json.dumps(
                {
                    "pid": builder.pid,
                    "pid_start": psutil.Process(builder.pid).create_time(),
                    "host": socket.gethostname(),
                    "command": "another builder",
                    "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
        )
        _, _, n_built = _prepare(cases[:1], root)  # nothing to build: it does not wait for the builder
        assert n_built == 0 and all(p.exists() for p in planted)
    finally:
        builder.kill()
        builder.wait()
    os.remove(root / ".lock")


# ---------------------------------------------------------------------------------------
# A worker killed from outside (the kernel's OOM killer, a stray kill -9)
# ---------------------------------------------------------------------------------------


def test_a_worker_killed_from_outside_ends_in_one_message_and_the_next_run_builds_the_rest(
    cases, tmp_path, monkeypatch
):
    import psutil

    root = tmp_path / "cache"
    monkeypatch.setenv(
        "BRATS_SEG_CRASH_AT", f"{cases[0].case_id}:1"
    )  # inherited by the workers; only they write entries
    with pytest.raises(DataError) as err:
        _prepare(cases, root, num_workers=2)
    message = str(err.value)
    assert f"a process preparing cases into {root} died (PID " in message and " killed by SIGKILL)" in message
    assert "fewer data.num_workers" in message
    workers = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            if "spawn_main" in " ".join(p.cmdline()):
                workers.append(p)
    assert psutil.wait_procs(workers, timeout=15)[1] == []  # the pool is gone (the resource tracker stays)
    assert _temporaries(root) == [] and not (root / ".lock").exists()
    built = [c.case_id for c in cases if (root / c.case_id / "meta.json").is_file()]
    assert cases[0].case_id not in built

    monkeypatch.delenv("BRATS_SEG_CRASH_AT")
    entries, errors, n_built = _prepare(cases, root, num_workers=2)
    assert errors == [] and n_built == len(cases) - len(built) and len(entries) == len(cases)


# The race behind that message: a broken pool's own thread terminates and joins its workers while
# the parent asks how they ended. Of two waitpid calls on one dead child only one gets its status;
# the other's Process.exitcode is None until the winner has recorded it. The parent used to ask
# once and, losing, said "it ended abruptly" (every full run on an AMD EPYC Zen 4). Here the other
# thread wins and records late on purpose, so the ordering that lost is the one tried every time.


def _a_dead_child():
    """A spawned child that SIGKILLed itself: dead (its sentinel says so) but not yet reaped."""
    import multiprocessing
    from multiprocessing.connection import wait

    child = multiprocessing.get_context("spawn").Process(target=signal.raise_signal, args=(signal.SIGKILL,))
    child.start()
    assert wait([child.sentinel], timeout=60), "the child did not die"
    return child


def _reaped_by_another_thread(monkeypatch, reap) -> threading.Event:
    """Start a thread that reaps the child with ``reap()`` and holds on for a moment before returning,
    as the pool's thread does between its waitpid and its record; returns once it has reaped."""
    real_waitpid, reaped = os.waitpid, threading.Event()

    def waitpid(pid, options):
        result = real_waitpid(pid, options)
        if threading.current_thread() is reaper and result[0] == pid:
            reaped.set()
            time.sleep(0.5)
        return result

    monkeypatch.setattr(os, "waitpid", waitpid)
    reaper = threading.Thread(target=reap, daemon=True)
    reaper.start()
    assert reaped.wait(30), "the other thread did not reap the child"
    return reaper


def test_a_killed_worker_is_named_when_another_thread_reaps_it_first(tmp_path, monkeypatch):
    child = _a_dead_child()
    reaper = _reaped_by_another_thread(monkeypatch, child.join)  # what the broken pool's thread does
    message = str(workers._worker_died([child], tmp_path))
    reaper.join(10)
    assert f"died (PID {child.pid} killed by SIGKILL)" in message


def test_a_worker_whose_end_nobody_recorded_keeps_the_plain_message(tmp_path, monkeypatch):
    child = _a_dead_child()
    reaper = _reaped_by_another_thread(monkeypatch, lambda: os.waitpid(child.pid, 0))  # a reaper that keeps nothing
    started = time.monotonic()
    message = str(workers._worker_died([child], tmp_path))
    reaper.join(10)
    assert f"a process preparing cases into {tmp_path} died (it ended abruptly): killed from outside" in message
    assert "PID" not in message and time.monotonic() - started < 10  # bounded by RECORD_WAIT_S, not a hang


def _die_if_told(i: int):
    """A preparation job: in a worker started with BRATS_SEG_TEST_DIE set, it kills its worker half a
    second in; elsewhere it takes a minute."""
    if os.environ.get("BRATS_SEG_TEST_DIE"):
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
    return str(i), None


def test_a_worker_the_pool_does_not_watch_is_said_at_once_when_it_dies(tmp_path, monkeypatch):
    """The pool's thread builds its list of workers to watch when it starts to wait, and each submit
    wakes it before starting a worker: a worker started just after is missing from the list until
    the next result, so its death went unseen for as long as the other worker's case took (1 run
    in 4 on Python 3.12 here). The second worker is started late on purpose, and it is the one that
    dies."""
    from concurrent.futures import ProcessPoolExecutor

    real_spawn = ProcessPoolExecutor._spawn_process

    def spawn_late(self):
        if not self._processes:
            return real_spawn(self)
        time.sleep(0.3)  # the pool's thread is waiting by now, watching the first worker alone
        monkeypatch.setenv("BRATS_SEG_TEST_DIE", "1")  # inherited by this worker only
        try:
            return real_spawn(self)
        finally:
            monkeypatch.delenv("BRATS_SEG_TEST_DIE")

    monkeypatch.setattr(ProcessPoolExecutor, "_spawn_process", spawn_late)
    started = time.monotonic()
    with pytest.raises(DataError) as err:
        workers.run_in_workers(_die_if_told, [(0,), (1,)], 2, tmp_path, lambda e: None)
    assert " killed by SIGKILL)" in str(err.value)
    assert time.monotonic() - started < 30  # seconds (spawning, the stop), not the minute the other case takes
