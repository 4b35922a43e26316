#!/usr/bin/env python
"""Does bf16 train as well as fp32? The same tiny recipe in both precisions over a few seeds, scored held out.

    python scripts/precision_study.py data=mni_gliomas epochs=30 seeds=0,1,2

For each precision and seed: ``train.py experiment=resolution_study resolution=tiny`` (4 mm,
48x64x48, depth 4) with ``trainer.seed=<seed>``, then ``scripts/evaluate.py`` on the test split
(cases no run trained or validated on), scored on the native grid. The recipe was not tuned on
these cases. Prints per-run WT/TC/ET Dice, each precision's mean over seeds, and the gap
between the precisions next to the spread between seeds, which is what the gap has to be
judged against. Writes ``<out>/precision_study.json``; run folders that already hold their
evaluation are not run again (the study resumes).

bf16 is refused on a CPU without native bf16 (``brats_seg.cpu.has_native_bf16``): there is
nothing to compare there.

Arguments are ``key=value``: ``data`` (default ``mni_gliomas``), ``epochs`` (30), ``seeds``
(``0,1,2``), ``precisions`` (``fp32,bf16``), ``out``; dotted keys go to every training run.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from resolution_study import EXTRA, REPO, parse_study_args, run_logged

REGIONS = ("wt", "tc", "et")


def _args(argv: list[str]) -> tuple[dict, list[str]]:
    args, passed = parse_study_args(argv, {"data": "mni_gliomas", "epochs": "30", "seeds": "0,1,2",
                                           "precisions": "fp32,bf16", "out": str(REPO / "outputs" / "precision_study")})
    bad = [p for p in args["precisions"].split(",") if p not in ("fp32", "bf16")]
    if bad:
        raise SystemExit(f"error: precisions {bad}: use fp32 and/or bf16")
    return args, passed


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(REPO))
    from brats_seg.cpu import cpu_kind, cpu_model_name, has_native_bf16
    from brats_seg.files import write_text_atomic
    from brats_seg.run_dir import RunFolder

    args, passed = _args(argv)
    precisions = args["precisions"].split(",")
    if "bf16" in precisions and not has_native_bf16():
        raise SystemExit(f"error: this CPU ({cpu_model_name()}) has no native bf16, so bf16 training is refused "
                         "here; run the study on a CPU with AVX512-BF16 or AMX-BF16")
    seeds = [int(s) for s in args["seeds"].split(",")]
    out = Path(args["out"]).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for precision in precisions:
        for seed in seeds:
            run_dir = out / f"{precision}-seed{seed}"
            summary_path = RunFolder(run_dir).summary_json("test")
            if not summary_path.is_file():
                print(f"{precision}, seed {seed}, {args['epochs']} epochs:", flush=True)
                log = out / f"{precision}-seed{seed}.log"
                run_logged([sys.executable, str(REPO / "train.py"), "experiment=resolution_study", f"data={args['data']}",
                            "resolution=tiny", *EXTRA["tiny"], f"trainer.epochs={args['epochs']}",
                            f"trainer.seed={seed}", "backend=cpu_onednn", f"backend.precision={precision}",
                            "tracking=none", f"run_dir={run_dir}", *passed], log)
                run_logged([sys.executable, str(REPO / "scripts" / "evaluate.py"), f"run_dir={run_dir}", "split=test",
                            "backend=cpu_onednn"], log)
            summary = json.loads(summary_path.read_text())
            runs.append({"precision": precision, "seed": seed, "n_cases": summary["n_cases"],
                         **{r: summary[f"dice_{r}"]["mean"] for r in REGIONS}})

    print("\n| precision | seed | test cases | Dice WT | Dice TC | Dice ET |\n|---|---|---|---|---|---|")
    for r in runs:
        print(f"| {r['precision']} | {r['seed']} | {r['n_cases']} | " + " | ".join(f"{r[x]:.3f}" for x in REGIONS) + " |")
    means = {}
    for precision in precisions:
        rows = [r for r in runs if r["precision"] == precision]
        means[precision] = {x: statistics.mean(r[x] for r in rows) for x in REGIONS}
        spread = {x: max(r[x] for r in rows) - min(r[x] for r in rows) for x in REGIONS}
        print(f"| {precision} mean of {len(rows)} seeds | | | " + " | ".join(
            f"{means[precision][x]:.3f} (range {spread[x]:.3f})" for x in REGIONS) + " |")
    result = {"cpu": cpu_model_name(), "cpu_kind": cpu_kind(), "data": args["data"], "epochs": int(args["epochs"]),
              "runs": runs, "means": means}
    if len(precisions) == 2:
        gap = {x: means["bf16"][x] - means["fp32"][x] for x in REGIONS}
        result["bf16_minus_fp32"] = gap
        print("\nbf16 - fp32 (mean over seeds): " + ", ".join(f"{x.upper()} {gap[x]:+.3f}" for x in REGIONS))
    path = out / "precision_study.json"
    write_text_atomic(path, json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
