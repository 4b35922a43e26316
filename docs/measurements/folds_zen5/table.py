#!/usr/bin/env python
"""The 5-fold study's table (run_folds.sh): each fold and the ensemble on the test split, legacy Dice
and lesion-wise Dice (2023) per region with their mean over regions, and the ensemble's
cross-validation score (every fold's val cases, each by its own fold).

    python docs/measurements/folds_zen5/table.py outputs/folds > docs/measurements/folds_zen5/table.md
"""

import json
import sys
from pathlib import Path

REGIONS = ("wt", "tc", "et")


def row(name: str, summary: dict) -> str:
    cells = []
    for column in ("dice", "lesion23_dice"):
        values = [summary[f"{column}_{r}"]["mean"] for r in REGIONS]
        cells += [f"{v:.3f}" for v in values] + [f"{sum(values) / len(values):.3f}"]
    return f"| {name} | {summary['n_cases']} | " + " | ".join(cells) + " |"


def main(folder: Path) -> None:
    print("| model | cases | Dice WT | TC | ET | mean | lesion-wise WT | TC | ET | mean |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for k in range(5):
        print(row(f"fold {k}, test", json.loads((folder / f"fold_{k}" / "eval" / "test" / "summary.json").read_text())))
    ens = folder / "ensemble" / "eval"
    print(row("ensemble of 5, test", json.loads((ens / "test" / "summary.json").read_text())))
    print(row("cross-validation (val of every fold)", json.loads((ens / "val" / "summary.json").read_text())))


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/folds"))
