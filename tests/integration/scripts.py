"""The project's entry points run as a user runs them: a fresh Python process from the repository,
its output kept for the assertion message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_script(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python *args`` in ``cwd`` (15 minutes at most); fails the test with the last 3000 characters
    of its stdout and stderr unless it exits 0."""
    proc = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc
