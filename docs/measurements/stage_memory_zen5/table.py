#!/usr/bin/env python
"""run.sh's runs: each phase's measured peak above the runtime (history.csv, largest epoch) against
the plan's moments (the training step's worst moment and its "validation"): the plan the run made
(plan.json) and this checkout's planner (the run's config planned again, lms=off as the runs).

    python docs/measurements/stage_memory_zen5/table.py /tmp/w/stage_memory/patch*
"""

import csv
import json
import sys
from pathlib import Path

from brats_seg.lms.planner.cost import compute_network_cost
from brats_seg.lms.planner.memory_model import memory_model_for
from brats_seg.lms.planner.timeline import simulate
from brats_seg.lms.planner.workload import Workload
from brats_seg.run_dir import RunFolder

GB = 1e9


def replanned(folder: Path) -> tuple[int, int]:
    """(training step's worst moment, validation moment) of this planner, every block kept."""
    cfg = RunFolder(folder).read_config()
    net = compute_network_cost(Workload.from_config(cfg), memory_model_for("CPU"))
    timeline = simulate(net, ["keep"] * len(net.blocks))
    moments = dict(zip(timeline.steps, timeline.total_bytes))
    return max(v for k, v in moments.items() if k != "validation"), moments["validation"]


def main(folders: list[str]) -> None:
    print(
        "| run | training steps, epoch 1 (before any validation): measured / planned | validation pass: measured / planned | "
        "epoch: measured / planned | validation: this planner | epoch: this planner | mapped files' pages |"
    )
    print("|---|---|---|---|---|---|---|")
    for folder in map(Path, folders):
        if not (folder / "history.csv").is_file():
            continue
        rows = list(csv.DictReader((folder / "history.csv").open()))
        plan = json.loads((folder / "plan.json").read_text())
        moments = {m["step"]: m["bytes"] for m in plan["timeline"]}
        val_plan = moments.pop("validation", None)
        train_plan = max(moments.values())

        def most(key: str) -> float:
            values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
            return max(values) if values else float("nan")

        # later epochs' training starts from what the validation before left resident: epoch 1's is the step's own
        train = float(rows[0]["train_measured_bytes"])
        val, epoch, files = (most(k) for k in ("val_measured_bytes", "measured_bytes", "file_bytes"))

        def cell(measured: float, planned: float | None) -> str:
            if planned is None:
                return f"{measured / GB:.2f} GB / -"
            return f"{measured / GB:.2f} / {planned / GB:.2f} GB ({measured / planned - 1:+.1%})"

        now_train, now_val = replanned(folder)
        print(
            f"| {folder.name} | {cell(train, train_plan)} | {cell(val, val_plan)} | "
            f"{cell(epoch, plan['predicted_peak_bytes'])} | {cell(val, now_val)} | "
            f"{cell(epoch, max(now_train, now_val))} | {files / GB:.2f} GB |"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
