"""Data-parallel scaling on one machine: ``workers`` processes x ``threads`` against one process
using all of those threads.

Both set-ups train the same global batch (split over the workers in the second) on the synthetic
dataset for two epochs of ``steps`` steps without validation; the time of the second epoch
(``history.csv``'s ``seconds``; the first traces the step) gives the throughput in cases/s. The
efficiency is the workers' throughput over the single process's: 1.0 means the workers, with the
same cores in all, train as fast as one process using all of them. A measurement, not a target.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import tempfile
from pathlib import Path

__all__ = ["measure_scaling"]

log = logging.getLogger(__name__)


def _train_args(conf, tmp: Path, run_dir: Path, threads: int) -> list[str]:
    r = conf.resolution
    grid = [
        f"resolution={r.name}",
        f"resolution.spacing_mm={r.spacing_mm}",
        f"resolution.shape=[{','.join(map(str, r.shape))}]",
    ]
    return [
        *grid,
        "data=synthetic",
        f"data.root={tmp / 'synthetic'}",
        f"data.synthetic_cases={conf.cases}",
        f"data.cache_dir={tmp / 'cache'}",
        f"model.depth={conf.depth}",
        f"model.base_filters={conf.filters}",
        "trainer.epochs=2",
        f"trainer.steps_per_epoch={conf.steps}",
        f"trainer.batch_size={conf.batch}",
        "trainer.val_every=1000",
        "trainer.augment=false",
        "backend=cpu_onednn",
        f"backend.intra_op_threads={threads}",
        "tracking=none",
        f"run_dir={run_dir}",
    ]


def _epoch_seconds(run_dir: Path) -> float:
    from brats_seg.run_dir import RunFolder

    return float(RunFolder(run_dir).read_state()["history"][-1]["seconds"])


def _run(cmds: list[list[str]], cwd: Path) -> None:
    procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    outs = [p.communicate()[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"a training process failed ({p.returncode}):\n{out[-3000:]}")


def measure_scaling(conf, train: list[str]) -> dict:
    """Train both set-ups of ``conf`` (:class:`brats_seg.script_configs.ScalingScriptConfig`) with the
    ``train`` command (``[python, train.py]``) in a temporary folder; the result record:
    the config, each set-up's epoch seconds and cases/s, and the ``efficiency``.

    Raises:
        ValueError: a batch that does not split evenly over the workers, or a count below 1.
        RuntimeError: a training process failed (its output's tail).
    """
    from brats_seg.distribute.cluster import free_local_ports

    for key in ("workers", "threads", "batch", "steps", "cases"):
        if getattr(conf, key) < 1:
            raise ValueError(f"{key}={getattr(conf, key)}: use 1 or more.")
    if conf.batch % conf.workers:
        raise ValueError(f"batch={conf.batch} does not split over workers={conf.workers}: use a multiple of it.")
    total_threads = conf.workers * conf.threads
    with tempfile.TemporaryDirectory(prefix="brats-scaling-") as t:
        tmp = Path(t)
        log.info("1 process x %d threads ...", total_threads)
        _run([[*train, *_train_args(conf, tmp, tmp / "single", total_threads)]], tmp)  # also writes the data and cache
        single = _epoch_seconds(tmp / "single")
        log.info("%d workers x %d thread(s) ...", conf.workers, conf.threads)
        ports = free_local_ports(conf.workers)
        workers = "distribute.workers=[" + ",".join(f"127.0.0.1:{p}" for p in ports) + "]"
        _run(
            [
                [
                    *train,
                    *_train_args(conf, tmp, tmp / "multi", conf.threads),
                    "distribute=multi_worker",
                    workers,
                    f"distribute.index={i}",
                ]
                for i in range(conf.workers)
            ],
            tmp,
        )
        multi = _epoch_seconds(tmp / "multi")
    cases = conf.steps * conf.batch
    return {
        "config": dataclasses.asdict(conf) | {"out": conf.out or None},
        "single_process": {"threads": total_threads, "epoch_s": single, "cases_per_s": cases / single},
        "workers": {
            "workers": conf.workers,
            "threads_each": conf.threads,
            "epoch_s": multi,
            "cases_per_s": cases / multi,
        },
        "efficiency": single / multi,
    }
