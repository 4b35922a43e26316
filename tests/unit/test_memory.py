"""The memory a process can use is the smaller of the machine's available RAM and its memory
cgroup's room: a SLURM job or a container with a 1 GB limit on a 24 GB machine plans for 1 GB
(``lms.limit``'s fractions on CPU are of this), not for the machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import new_memory_cgroup

REPO = Path(__file__).resolve().parents[2]
PRINT_AVAILABLE = (
    "import sys; sys.path.insert(0, sys.argv[1]); from brats_seg.backend import device_memory_bytes; "
    "print(device_memory_bytes('CPU'))"
)


def test_the_cpu_budget_is_held_to_the_memory_cgroup(tmp_path):
    import psutil

    cgroup = new_memory_cgroup(f"brats_seg_memory_test_{os.getpid()}")
    limit = 1 << 30
    try:
        (
            cgroup / ("memory.limit_in_bytes" if (cgroup / "memory.limit_in_bytes").exists() else "memory.max")
        ).write_text(str(limit))

        def join():  # the child joins the cgroup before it runs Python
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        out = subprocess.run(
            [sys.executable, "-c", PRINT_AVAILABLE, str(REPO)],
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=join,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        inside = int(out.stdout.split()[-1])
        assert 0 < inside <= limit < psutil.virtual_memory().available  # the cgroup's room, not the machine's RAM
        assert inside > limit // 2  # the limit less what the interpreter holds, not a made-up figure

        outside = subprocess.run(
            [sys.executable, "-c", PRINT_AVAILABLE, str(REPO)], capture_output=True, text=True, timeout=120
        )
        assert int(outside.stdout.split()[-1]) > limit  # this machine has more than 1 GB free
    finally:
        cgroup.rmdir()


def test_without_a_cgroup_limit_the_machines_available_ram_counts(monkeypatch):
    import psutil

    from brats_seg import memory

    monkeypatch.setattr(memory, "cgroup_memory", lambda pid="self": {"limit_bytes": None, "usage_bytes": 5})
    assert abs(memory.available_memory_bytes() - psutil.virtual_memory().available) < 256 << 20
    monkeypatch.setattr(memory, "cgroup_memory", lambda pid="self": {"limit_bytes": 3 << 30, "usage_bytes": 1 << 30})
    assert memory.available_memory_bytes() == 2 << 30
