"""The docs/studies.md tables of the patch-schedule study, from a record folder's study.json and
its runs' history.csv: lesion-wise Dice (BraTS 2023) first, legacy Dice and HD95 beside it, mean ±
std over seeds; steps actually taken; the process's peak and the peak above the runtime apart.

    python docs/measurements/patch_schedule_zen5/tables.py docs/measurements/patch_schedule_zen5/half
"""

import csv
import json
import statistics
import sys
from pathlib import Path

folder = Path(sys.argv[1])
study = json.loads((folder / "study.json").read_text())
GB = 1e9
NAMES = {"whole": "whole volume", "patch 48x48x48": "48³ patches", "patch 96x96x96": "96³ patches", "grow": "grow"}


def pm(values, digits=3, scale=1.0):
    values = [v / scale for v in values if v is not None]
    if not values:
        return "-"
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def runs_of(arm):
    return [r for r in study["runs"] if r["name"] in arm["runs"]]


print("| arm | steps taken | steps per stage | peak of the process | peak above the runtime | measured / planned - 1, per stage |")
print("|---|---|---|---|---|---|")
for arm in study["arms"]:
    runs = runs_of(arm)
    per_stage = []
    for r in runs:
        rows = list(csv.DictReader((folder / r["name"] / "history.csv").open()))
        counts = {}
        for row in rows:
            counts[int(float(row.get("stage") or 1))] = counts.get(int(float(row.get("stage") or 1)), 0) + int(float(row["steps"]))
        per_stage.append(counts)
    stages = sorted(per_stage[0])
    stage_text = " / ".join(f"{min(c[s] for c in per_stage)}-{max(c[s] for c in per_stage)}" for s in stages) if len(stages) > 1 else "-"
    errors = [[r["plan_error_by_stage"][str(s)] for r in runs] for s in stages]
    err_text = " / ".join(f"{100 * min(e):+.1f}..{100 * max(e):+.1f}%" for e in errors)
    print(
        f"| {NAMES.get(arm['label'], arm['label'])} | {pm([r['steps_taken'] for r in runs], 0)} | {stage_text} "
        f"| {pm([r['peak_process_bytes'] for r in runs], 2, GB)} GB | {pm([r['peak_above_runtime_bytes'] for r in runs], 2, GB)} GB | {err_text} |"
    )

for name in study["sets"]:
    print(f"\n{name}:\n")
    print("| arm | lesion-wise WT | TC | ET | legacy Dice WT | TC | ET | HD95 WT / TC / ET (mm) |")
    print("|---|---|---|---|---|---|---|---|")
    for arm in study["arms"]:
        m = arm["sets"][name]["metrics"]
        cells = [pm(m[f"lesion23_dice_{r}"]["values"]) for r in ("wt", "tc", "et")]
        cells += [pm(m[f"dice_{r}"]["values"]) for r in ("wt", "tc", "et")]
        hd = " / ".join(f"{m[f'hd95_{r}']['mean']:.1f}" for r in ("wt", "tc", "et"))
        print(f"| {NAMES.get(arm['label'], arm['label'])} | " + " | ".join(cells) + f" | {hd} |")
