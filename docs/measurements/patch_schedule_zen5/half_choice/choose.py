#!/usr/bin/env python
"""Issue 46: which grow schedule, chosen on the validation split (3 cases) only.

    python docs/measurements/patch_schedule_zen5/half_choice/choose.py

Per candidate (the whole volume's share of the time: 1/2 is the study's grow, half/; 1/4 and 1/8
trained by run_choice.sh) and for the 48^3 arm beside them: mean and std over seeds 0-2 of the
validation lesion-wise Dice (BraTS 2023/2024: lesion23) and legacy Dice, and the steps taken. The
rule, fixed before the runs: the candidate with the highest mean validation lesion-wise TC; a
tie (within 0.001) keeps the preset. Prints the table and the choice, then (eval_chosen.sh having
scored the chosen candidate's runs) the held-out (20 cases) and test tables of the study's arms and
the chosen candidate.
"""

import csv
import json
import statistics
from pathlib import Path

OUT = Path("outputs")
ARMS = {
    "grow, whole 1/2 (preset)": [OUT / f"patch_schedule_half/arm-grow_seed-{s}" for s in range(3)],
    "grow, whole 1/4": [OUT / f"patch_schedule_half_choice/whole0.25_seed-{s}" for s in range(3)],
    "grow, whole 1/8": [OUT / f"patch_schedule_half_choice/whole0.125_seed-{s}" for s in range(3)],
    "48^3 patches": [OUT / f"patch_schedule_half/arm-patch48_seed-{s}" for s in range(3)],
}
KEYS = ["lesion23_dice_wt", "lesion23_dice_tc", "lesion23_dice_et", "dice_wt", "dice_tc", "dice_et"]


def main() -> None:
    print("| val (3 cases), mean ± std over seeds 0-2 | lesion-wise WT | TC | ET | legacy WT | TC | ET | steps |")
    print("|---|---|---|---|---|---|---|---|")
    means = {}
    for arm, runs in ARMS.items():
        values = {k: [json.load(open(r / "eval/val/summary.json"))[k]["mean"] for r in runs] for k in KEYS}
        steps = [sum(float(row["steps"]) for row in csv.DictReader(open(r / "history.csv"))) for r in runs]
        cells = [f"{statistics.mean(v):.3f} ± {statistics.stdev(v):.3f}" for v in values.values()]
        print(f"| {arm} | {' | '.join(cells)} | {statistics.mean(steps):.0f} |")
        means[arm] = statistics.mean(values["lesion23_dice_tc"])
    grow = {a: m for a, m in means.items() if a.startswith("grow")}
    best = max(grow, key=grow.get)
    preset = "grow, whole 1/2 (preset)"
    chosen = preset if grow[best] - grow[preset] <= 0.001 else best
    print(f"\nchosen on val lesion-wise TC: {chosen} ({grow[chosen]:.3f}; the preset {grow[preset]:.3f})")
    arms = {a: ARMS[a] for a in (preset, chosen, "48^3 patches")}
    arms["whole volume"] = [OUT / f"patch_schedule_half/arm-whole_seed-{s}" for s in range(3)]
    for split, title in (("all@mni_gliomas_heldout", "held-out (20)"), ("test", "test (4)")):
        print(f"\n| {title}, mean ± std over seeds | lesion-wise WT | TC | ET | legacy WT | TC | ET | lesion-wise TC per seed |")
        print("|---|---|---|---|---|---|---|---|")
        for arm, runs in arms.items():
            values = {k: [json.load(open(r / "eval" / split / "summary.json"))[k]["mean"] for r in runs] for k in KEYS}
            cells = [f"{statistics.mean(v):.3f} ± {statistics.stdev(v):.3f}" for v in values.values()]
            seeds = ", ".join(f"{v:.3f}" for v in values["lesion23_dice_tc"])
            print(f"| {arm} | {' | '.join(cells)} | {seeds} |")


if __name__ == "__main__":
    main()
