#!/usr/bin/env python
"""Which augmentation preset holds across seeds and scanners? Each preset over a few seeds, scored
held out on matched cases and on the same cases acquired as another scanner would.

    python scripts/recipe_study.py                                     # light,nnunet x seeds 0,1,2
    python scripts/recipe_study.py presets=nnunet seeds=1              # one arm (they resume)

For each preset and seed (an arm, its own run folder ``<out>/<preset>-seed<seed>``):
``train.py data=mni_gliomas resolution=half model.depth=4 trainer.epochs=15
trainer.augment=<preset> trainer.seed=<seed>``, then ``scripts/evaluate.py`` (post-processing
chosen on the arm's val split, as by default) on cases no run trained or validated on, scored
on the native grid: the 4 test cases as generated (``matched``) and as ``data=mni_gliomas_shifted``
holds them (``shifted``: the head tilted up to 15 degrees more, 4 mm slices resampled to 1 mm,
another protocol's tumour contrast, noise, gamma and bias), and 20 cases of another seed
(``split=all on=mni_gliomas_heldout``: ``heldout``, and ``heldout_shifted``). Neither the
presets nor the recipe were tuned on these cases. An arm whose evaluations are written is not
run again; an interrupted one resumes from its run folder.

Prints, per preset, the mean and standard deviation over seeds of legacy Dice and BraTS 2023
lesion-wise Dice per region on each set, and each arm's training time; writes
``<out>/recipe_study.json`` (with the means before post-processing too). Arguments are ``key=value``: ``presets`` (``light,nnunet``),
``seeds`` (``0,1,2``), ``epochs`` (15), ``resolution`` (``half``), ``out``; dotted keys go to
every training run.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from resolution_study import REPO, parse_study_args, run_logged

REGIONS = ("wt", "tc", "et")
METRICS = {"dice": "Dice", "lesion23_dice": "lesion-wise Dice"}
# name -> (split, on): where evaluate.py writes it is eval/<split>[@<on>]
SETS = {"matched": ("test", ""), "shifted": ("test", "mni_gliomas_shifted"),
        "heldout": ("all", "mni_gliomas_heldout"), "heldout_shifted": ("all", "mni_gliomas_heldout_shifted")}


def _args(argv: list[str]) -> tuple[dict, list[str]]:
    args, passed = parse_study_args(argv, {"presets": "light,nnunet", "seeds": "0,1,2", "epochs": "15",
                                           "resolution": "half", "out": str(REPO / "outputs" / "recipe_study")})
    bad = [p for p in args["presets"].split(",") if p not in ("none", "light", "nnunet")]
    if bad:
        raise SystemExit(f"error: presets {bad}: use among none, light, nnunet")
    return args, passed


def run_arm(run_dir: Path, preset: str, seed: int, args: dict, passed: list[str]) -> dict:
    """Train and evaluate one arm (what is done already is kept); its time and summaries."""
    from brats_seg.files import write_text_atomic
    from brats_seg.run_dir import RunFolder

    folder, log = RunFolder(run_dir), run_dir.parent / f"{run_dir.name}.log"
    timing_path = run_dir.parent / f"{run_dir.name}.time.json"
    timing = json.loads(timing_path.read_text()) if timing_path.is_file() else {}
    print(f"{preset}, seed {seed}:", flush=True)
    if int((folder.read_state() or {}).get("epoch", 0)) < int(args["epochs"]):  # not trained to the end yet
        t0 = time.time()
        run_logged([sys.executable, str(REPO / "train.py"), "data=mni_gliomas", f"resolution={args['resolution']}",
                    "model.depth=4", f"trainer.epochs={args['epochs']}", f"trainer.augment={preset}",
                    f"trainer.seed={seed}", "backend=cpu_onednn", "tracking=none", f"run_dir={run_dir}", *passed], log)
        timing["train_s"] = timing.get("train_s", 0.0) + time.time() - t0  # summed over resumed starts
        write_text_atomic(timing_path, json.dumps(timing) + "\n")
    for split, on in SETS.values():
        if not folder.summary_json(f"{split}@{on}" if on else split).is_file():
            run_logged([sys.executable, str(REPO / "scripts" / "evaluate.py"), f"run_dir={run_dir}", f"split={split}",
                        *([f"on={on}"] if on else []), "backend=cpu_onednn", "evaluate.overlays=false"], log)
    out = {"preset": preset, "seed": seed, "train_s": round(timing.get("train_s", float("nan")), 1)}
    for name, (split, on) in SETS.items():
        summary = json.loads(folder.summary_json(f"{split}@{on}" if on else split).read_text())
        out[name] = {f"{m}_{r}": summary[f"{m}_{r}"]["mean"] for m in METRICS for r in REGIONS}
        out[name]["n_cases"] = summary["n_cases"]
        before = (summary.get("postprocess") or {}).get("unprocessed_mean")
        out[f"{name}_unprocessed"] = {k: before.get(k, out[name][k]) if before else out[name][k]
                                      for k in out[name] if k != "n_cases"}
    return out


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from brats_seg.cpu import cpu_kind, cpu_model_name
    from brats_seg.files import write_text_atomic

    args, passed = _args(argv)
    presets, seeds = args["presets"].split(","), [int(s) for s in args["seeds"].split(",")]
    out = Path(args["out"]).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    runs = [run_arm(out / f"{p}-seed{s}", p, s, args, passed) for p in presets for s in seeds]

    means = {}
    print(f"\n{cpu_model_name()} ({cpu_kind()}); mean ± std over seeds; test cases scored on the native grid\n")
    names = [n for s in SETS for n in (s, f"{s}_unprocessed")]
    for p in presets:
        rows = [r for r in runs if r["preset"] == p]
        means[p] = {n: {k: _mean_std([r[n][k] for r in rows]) for k in rows[0][n] if k != "n_cases"} for n in names}
    for metric, title in METRICS.items():
        print(f"{title} (post-processed), mean ± std over seeds")
        print("| preset | seeds | training | " + " | ".join(f"{n} ({runs[0][n]['n_cases']}) {r.upper()}"
                                                        for n in SETS for r in REGIONS) + " |")
        print("|---" * (3 + len(SETS) * len(REGIONS)) + "|")
        for p in presets:
            rows = [r for r in runs if r["preset"] == p]
            cells = [f"{means[p][n][f'{metric}_{r}'][0]:.3f} ± {means[p][n][f'{metric}_{r}'][1]:.3f}"
                     for n in SETS for r in REGIONS]
            train_min = statistics.mean(r["train_s"] for r in rows) / 60
            print(f"| {p} | {len(rows)} | {train_min:.1f} min | " + " | ".join(cells) + " |")
        print()
    result = {"cpu": cpu_model_name(), "cpu_kind": cpu_kind(), "epochs": int(args["epochs"]),
              "resolution": args["resolution"], "overrides": passed, "runs": runs,
              "means": {p: {n: {k: {"mean": v[0], "std": v[1]} for k, v in means[p][n].items()} for n in names}
                        for p in presets}}
    path = out / "recipe_study.json"
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
