#!/usr/bin/env python
"""Data-parallel scaling on one machine: 2 workers x 1 thread against 1 process x 2 threads.

    python scripts/scaling.py                                   # half resolution, depth 3, 16 filters
    python scripts/scaling.py --resolution tiny --steps 20      # quick
    python scripts/scaling.py --workers 2 --threads 1 --out scaling.json

Both set-ups train the same global batch (``--batch``, split over the workers in the
second) on the synthetic dataset for two epochs of ``--steps`` steps without validation;
the time of the second epoch (``history.csv``'s ``seconds``, the first one traces the step)
gives the throughput in cases/s. The efficiency is the workers' throughput over the single
process's: 1.0 means the workers, with the same cores in all, train as fast as one
process using all of them. It is a measurement, not a target: on one 2-core machine the
workers add gradient all-reduces over loopback gRPC and lose intra-op parallelism.
Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from brats_seg.distribute.cluster import free_local_ports  # noqa: E402
from brats_seg.files import write_text_atomic  # noqa: E402
from brats_seg.run_dir import RunFolder  # noqa: E402


def _common(args, tmp: Path, run_dir: Path, threads: int) -> list[str]:
    return [sys.executable, str(REPO / "train.py"), f"resolution={args.resolution}", "data=synthetic",
            f"data.root={tmp / 'synthetic'}", f"data.synthetic_cases={args.cases}", f"data.cache_dir={tmp / 'cache'}",
            f"model.depth={args.depth}", f"model.base_filters={args.filters}", "trainer.epochs=2",
            f"trainer.steps_per_epoch={args.steps}", f"trainer.batch_size={args.batch}", "trainer.val_every=1000",
            "trainer.augment=false", "backend=cpu_onednn", f"backend.intra_op_threads={threads}",
            "tracking=none", f"run_dir={run_dir}"]


def _epoch_seconds(run_dir: Path) -> float:
    return float(RunFolder(run_dir).read_state()["history"][-1]["seconds"])


def _run(cmds: list[list[str]], cwd: Path) -> None:
    procs = [subprocess.Popen(c, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for c in cmds]
    outs = [p.communicate()[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit(f"error: a training process failed ({p.returncode}):\n{out[-3000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resolution", default="half")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--filters", type=int, default=16)
    parser.add_argument("--batch", type=int, default=2, help="global batch (a multiple of --workers)")
    parser.add_argument("--steps", type=int, default=8, help="steps per epoch")
    parser.add_argument("--cases", type=int, default=24, help="synthetic cases (enough for steps x batch)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    parser.add_argument("--out", type=Path, default=None, help="also write the result as JSON")
    args = parser.parse_args(argv)
    total_threads = args.workers * args.threads

    with tempfile.TemporaryDirectory(prefix="brats-scaling-") as t:
        tmp = Path(t)
        print(f"1 process x {total_threads} threads ...", flush=True)
        _run([_common(args, tmp, tmp / "single", total_threads)], tmp)  # also writes the data and cache
        single = _epoch_seconds(tmp / "single")
        print(f"{args.workers} workers x {args.threads} thread(s) ...", flush=True)
        ports = free_local_ports(args.workers)
        workers = "distribute.workers=[" + ",".join(f"127.0.0.1:{p}" for p in ports) + "]"
        _run([_common(args, tmp, tmp / "multi", args.threads) + ["distribute=multi_worker", workers,
                                                                 f"distribute.index={i}"]
              for i in range(args.workers)], tmp)
        multi = _epoch_seconds(tmp / "multi")

    cases = args.steps * args.batch
    result = {
        "config": vars(args) | {"out": str(args.out) if args.out else None},
        "single_process": {"threads": total_threads, "epoch_s": single, "cases_per_s": cases / single},
        "workers": {"workers": args.workers, "threads_each": args.threads, "epoch_s": multi,
                    "cases_per_s": cases / multi},
        "efficiency": single / multi,
    }
    print(f"\n{'set-up':<28} {'epoch (s)':>10} {'cases/s':>9}")
    print(f"{f'1 process x {total_threads} threads':<28} {single:>10.1f} {cases / single:>9.3f}")
    print(f"{f'{args.workers} workers x {args.threads} thread(s)':<28} {multi:>10.1f} {cases / multi:>9.3f}")
    print(f"scaling efficiency (workers / single): {single / multi:.2f}")
    if args.out:
        write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
