#!/usr/bin/env python
"""`make demo`'s recipe over seeds: is the first result a user sees luck, or the recipe?

    python scripts/demo_seeds.py                                   # seeds 0,1,2 into outputs/demo_seeds
    python scripts/demo_seeds.py seeds=3 out=outputs/demo_seeds    # one more arm (arms resume)
    python scripts/demo_seeds.py trainer.epochs=120 out=outputs/demo_e120   # a variant: dotted keys go to train.py

For each seed (an arm, its own run folder ``<out>/seed<seed>``): ``train.py experiment=demo
trainer.seed=<seed>`` (with the dotted overrides given), then ``scripts/evaluate.py`` on the
held-out test split (post-processing chosen on the val split, as ``make demo`` does). An arm
trained to the end and evaluated is not run again; an interrupted one resumes from its run
folder. Prints per seed and as mean ± std over seeds: legacy Dice and BraTS 2023 lesion-wise
Dice per region (and before post-processing), the test cases whose ET is wrong on either side
(reference without ET and ET predicted, or the reverse), and the training time; writes
``<out>/demo_seeds.json``. Arguments are ``key=value``: ``seeds`` (``0,1,2``), ``out``.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import time
from pathlib import Path

from study import REPO, parse_study_args, run_logged

REGIONS = ("wt", "tc", "et")
METRICS = {"dice": "Dice", "lesion23_dice": "lesion-wise Dice (2023)"}


def run_arm(run_dir: Path, seed: int, passed: list[str]) -> dict:
    """Train and evaluate one seed (what is done is kept); its time, means and ET errors."""
    from brats_seg.files import write_text_atomic
    from brats_seg.run_dir import RunFolder

    folder, log = RunFolder(run_dir), run_dir.parent / f"{run_dir.name}.log"
    timing_path = run_dir.parent / f"{run_dir.name}.time.json"
    timing = json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    print(f"seed {seed}:", flush=True)
    state = folder.read_state() if folder.has_config() else None
    if state is None or int(state.get("epoch", 0)) < folder.read_config().trainer.epochs:
        t0 = time.time()
        run_logged([sys.executable, str(REPO / "train.py"), "experiment=demo", f"trainer.seed={seed}",
                    "tracking=none", f"run_dir={run_dir}", *passed], log)
        timing["train_s"] = timing.get("train_s", 0.0) + time.time() - t0  # summed over resumed starts
        write_text_atomic(timing_path, json.dumps(timing) + "\n")
    if not folder.summary_json("test").is_file():
        t0 = time.time()
        run_logged([sys.executable, str(REPO / "scripts" / "evaluate.py"), f"run_dir={run_dir}", "split=test"], log)
        timing["evaluate_s"] = time.time() - t0
        write_text_atomic(timing_path, json.dumps(timing) + "\n")
    summary = json.loads(folder.summary_json("test").read_text())
    before = (summary.get("postprocess") or {}).get("unprocessed_mean") or {}
    out = {"seed": seed, "train_s": round(timing.get("train_s", float("nan")), 1),
           "evaluate_s": round(timing.get("evaluate_s", float("nan")), 1), "n_cases": summary["n_cases"],
           "postprocess": (summary.get("postprocess") or {}).get("described", "none")}
    for m in METRICS:
        for r in REGIONS:
            out[f"{m}_{r}"] = summary[f"{m}_{r}"]["mean"]
            out[f"{m}_{r}_unprocessed"] = before.get(f"{m}_{r}", out[f"{m}_{r}"])
    with open(folder.metrics_csv("test"), newline="") as f:
        rows = list(csv.DictReader(f))
    out["et_false"] = [r["case_id"] for r in rows if float(r["lesions_ref_et"] or 0) == 0
                       and float(r["lesions_pred_et"] or 0) > 0]
    out["et_missed"] = [r["case_id"] for r in rows if float(r["lesions_ref_et"] or 0) > 0
                        and float(r["lesions_pred_et"] or 0) == 0]
    return out


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from brats_seg.cpu import cpu_kind, cpu_model_name
    from brats_seg.files import write_text_atomic

    args, passed = parse_study_args(argv, {"seeds": "0,1,2", "out": str(REPO / "outputs" / "demo_seeds")})
    out = Path(args["out"]).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    runs = [run_arm(out / f"seed{s}", int(s), passed) for s in args["seeds"].split(",")]

    print(f"\n{cpu_model_name()} ({cpu_kind()}); make demo's recipe{' with ' + ' '.join(passed) if passed else ''}; "
          f"held-out test split ({runs[0]['n_cases']} cases), native 1 mm grid\n")
    columns = [(m, r) for m in METRICS for r in REGIONS]
    print("| seed | " + " | ".join(f"{METRICS[m]} {r.upper()}" for m, r in columns)
          + " | ET on a case without ET | ET missed | training |")
    print("|---" * (len(columns) + 4) + "|")
    for run in runs:
        cells = [f"{run[f'{m}_{r}']:.3f} ({run[f'{m}_{r}_unprocessed']:.3f})" for m, r in columns]
        print(f"| {run['seed']} | " + " | ".join(cells) + f" | {', '.join(run['et_false']) or '-'} | "
              f"{', '.join(run['et_missed']) or '-'} | {run['train_s'] / 60:.1f} min |")
    means = {}
    for m, r in columns:
        for key in (f"{m}_{r}", f"{m}_{r}_unprocessed"):
            values = [run[key] for run in runs]
            means[key] = {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    print("| mean ± std | " + " | ".join(f"{means[f'{m}_{r}']['mean']:.3f} ± {means[f'{m}_{r}']['std']:.3f}"
                                        for m, r in columns) + " | | | |")
    print("\n(in brackets: before post-processing)")
    result = {"cpu": cpu_model_name(), "cpu_kind": cpu_kind(), "overrides": passed, "runs": runs, "means": means}
    path = out / "demo_seeds.json"
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
