"""A benchmark sweep: every combination of a grid of overrides, each timed in a fresh process.

A sweep file (``configs/benchmark_sweeps/<name>.yaml``, or any YAML path) names ``axes`` (override
key -> values) and an optional ``base`` (overrides of every point). :func:`run_sweep` runs the
benchmark command once per combination not yet in its JSON lines file (a sweep resumes), appends
each result there, and draws the figures of :mod:`brats_seg.plots`.
"""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
from pathlib import Path

from brats_seg.project import project_dir

__all__ = ["load_sweep_spec", "measure_point", "read_jsonl", "run_sweep"]

log = logging.getLogger(__name__)


def load_sweep_spec(name: str) -> tuple[Path, dict]:
    """The sweep file named by ``benchmark.sweep`` (``configs/benchmark_sweeps/<name>.yaml`` or a
    path) and its content.

    Raises:
        ValueError: no such sweep (the named ones listed), or a file without an ``axes:`` mapping.
    """
    import yaml

    sweeps = project_dir() / "configs" / "benchmark_sweeps"  # the named sweeps
    path = Path(name).expanduser()
    if not path.suffix:
        path = sweeps / f"{name}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in sweeps.glob("*.yaml")))
        raise ValueError(
            f"benchmark.sweep={name!r}: no {path}; use one of {known} or a YAML file with base: and axes:."
        )
    spec = yaml.safe_load(path.read_text()) or {}
    if not isinstance(spec.get("axes"), dict) or not spec["axes"]:
        raise ValueError(
            f"{path}: expected 'axes:' mapping override keys to lists of values (and an optional 'base:')."
        )
    return path, spec


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON lines file; none if it does not exist."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def measure_point(cmd: list[str], cwd: Path) -> dict | str:
    """One benchmark point in a fresh process: its record (the last JSON line it printed; oneDNN's
    verbose lines, if asked for, come before it), or why it failed (its last error line)."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    return json.loads(lines[-1])


def run_sweep(conf, overrides: list[str], command: list[str]) -> Path:
    """Every combination of ``conf.benchmark.sweep``'s axes not measured yet, each as
    ``command + overrides + the point`` in a fresh process; the JSON lines file, then the plots.

    Args:
        conf: the benchmark's config (``benchmark.sweep``, ``benchmark.out``, ``benchmark.onednn_verbose``).
        overrides: the command line's overrides, passed on to every point (but the sweep's own keys).
        command: the benchmark's command (``[python, scripts/benchmark.py]``); it prints one JSON line.
    """
    from brats_seg.files import write_text_atomic
    from brats_seg.plots import plot_benchmark_sweep, plot_width_sweep

    path, spec = load_sweep_spec(conf.benchmark.sweep)
    # a profiled run (benchmark.onednn_verbose=true: its steps are slowed by the printing) is kept
    # apart from the timed one, in profile.jsonl beside it
    default = "profile.jsonl" if conf.benchmark.onednn_verbose else "results.jsonl"
    root = project_dir()  # the points run here; results by default under its outputs/benchmark/<sweep>/
    out = Path(conf.benchmark.out or root / "outputs" / "benchmark" / path.stem / default)
    out.parent.mkdir(parents=True, exist_ok=True)
    base = [*spec.get("base", []), *(o for o in overrides if not o.startswith(("benchmark.sweep=", "benchmark.out=")))]
    keys = list(spec["axes"])
    records = read_jsonl(out)
    done = {json.dumps(r["sweep"]) for r in records if "sweep" in r}
    combos = [dict(zip(keys, values)) for values in itertools.product(*(spec["axes"][k] for k in keys))]
    for i, combo in enumerate(combos, 1):
        if json.dumps(combo) in done:
            continue
        cmd = [*command, *base, *(f"{k}={v}" for k, v in combo.items()), "benchmark.sgemm=true"]
        log.info("[%d/%d] %s", i, len(combos), " ".join(f"{k}={v}" for k, v in combo.items()))
        result = measure_point(cmd, root)
        if isinstance(result, str):  # e.g. bf16 refused on a CPU without it: said, and the sweep goes on
            log.info("  failed: %s", result)
            continue
        records.append({"sweep": combo, **result})  # the whole file replaced: a kill never leaves half a line
        write_text_atomic(out, "".join(json.dumps(r) + "\n" for r in records))
    if "model.base_filters" in spec["axes"]:  # a width sweep: one figure, with the reorders if profiled
        timed = read_jsonl(out.parent / "results.jsonl")
        profile = read_jsonl(out.parent / "profile.jsonl")
        if timed:
            log.info("wrote %s", plot_width_sweep(timed, out.parent / "width.png", profile))
        return out
    for png in plot_benchmark_sweep(records, out.parent):
        log.info("wrote %s", png)
    return out
