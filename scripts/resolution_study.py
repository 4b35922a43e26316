#!/usr/bin/env python
"""The resolution study: one recipe trained and scored at 4, 2, 1 and 0.5 mm, and its chart.

    python scripts/resolution_study.py data=mni_gliomas epochs=30
    python scripts/resolution_study.py data=mni_gliomas epochs=30 epochs_2x=12 resolutions=tiny,half,full,2x
    python scripts/resolution_study.py out=outputs/resolution_study plot_only=true

For each resolution: ``train.py experiment=resolution_study`` (depth 4, 6 base filters, batch 1;
bf16 where the CPU computes it natively, else fp32; at 2x ``lms=auto`` under ``limit_2x``),
then ``scripts/evaluate.py`` on the test split, scored on the native grid of the original
label files, so every resolution is judged on the same voxels. A run folder that already
holds its evaluation is not run again (the study resumes). Writes ``<out>/study.json`` (the
per-resolution summaries and times) and ``<out>/resolution_study.png`` (Dice per region
against resolution), and prints a Markdown table.

Arguments are ``key=value``: ``data`` (a data config, default ``mni_gliomas``), ``epochs``
(30), ``epochs_2x`` (default ``epochs``), ``resolutions``, ``limit_2x`` (``21GB``), ``out``,
``plot_only``; anything else with a dot (``trainer.seed=1``) is passed to every training run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SPACING_MM = {"tiny": 4.0, "half": 2.0, "full": 1.0, "2x": 0.5}
EXTRA = {"tiny": ["resolution.shape=[48,64,48]"]}  # depth 4 divides it; the brain box at 4 mm fits


def parse_study_args(argv: list[str], defaults: dict[str, str]) -> tuple[dict, list[str]]:
    """A study's ``key=value`` arguments: ``(its own, the dotted config overrides for train.py)``."""
    args, passed = dict(defaults), []
    for a in argv:
        key, sep, value = a.partition("=")
        if not sep:
            raise SystemExit(f"error: expected key=value, got {a!r}")
        if key in args:
            args[key] = value
        elif "." in key:
            passed.append(a)
        else:
            raise SystemExit(f"error: unknown argument {key!r}; known: {', '.join(args)} (or dotted config keys)")
    return args, passed


def _args(argv: list[str]) -> tuple[dict, list[str]]:
    args, passed = parse_study_args(argv, {
        "data": "mni_gliomas", "epochs": "30", "epochs_2x": "", "resolutions": "tiny,half,full,2x",
        "limit_2x": "21GB", "out": str(REPO / "outputs" / "resolution_study"), "plot_only": "false"})
    unknown = [r for r in args["resolutions"].split(",") if r not in SPACING_MM]
    if unknown:
        raise SystemExit(f"error: resolutions {unknown}: use among {', '.join(SPACING_MM)}")
    return args, passed


def run_logged(cmd: list[str], log: Path) -> float:
    """Run ``cmd`` in the repository with its output appended to ``log``; its wall time in seconds."""
    print("  " + " ".join(cmd[1:]), flush=True)
    t0 = time.time()
    with open(log, "a") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise SystemExit(f"error: {Path(cmd[1]).name} failed (exit {proc.returncode}); see {log}")
    return time.time() - t0


def main(argv: list[str]) -> int:
    from brats_seg.cpu import cpu_kind, cpu_model_name, has_native_bf16
    from brats_seg.files import write_text_atomic
    from brats_seg.plots import plot_resolution_study
    from brats_seg.run_dir import RunFolder

    args, passed = _args(argv)
    out = Path(args["out"]).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    precision = "bf16" if has_native_bf16() else "fp32"
    study_path = out / "study.json"
    study = json.loads(study_path.read_text()) if study_path.is_file() else {"runs": {}}
    study.update(cpu=cpu_model_name(), cpu_kind=cpu_kind(), data=args["data"], precision=precision)
    for res in args["resolutions"].split(","):
        run_dir = out / res
        folder = RunFolder(run_dir)
        summary_path = folder.summary_json("test")
        epochs = args["epochs_2x"] if res == "2x" and args["epochs_2x"] else args["epochs"]
        if args["plot_only"] != "true" and not summary_path.is_file():
            print(f"{res} ({SPACING_MM[res]} mm), {epochs} epochs:", flush=True)
            lms = ["lms=auto", f"lms.limit={args['limit_2x']}"] if res == "2x" else []
            train_s = run_logged([sys.executable, str(REPO / "train.py"), "experiment=resolution_study", f"data={args['data']}",
                            f"resolution={res}", *EXTRA.get(res, []), f"trainer.epochs={epochs}",
                            "backend=cpu_onednn", f"backend.precision={precision}", *lms, f"run_dir={run_dir}",
                            *passed], out / f"{res}.log")
            eval_s = run_logged([sys.executable, str(REPO / "scripts" / "evaluate.py"), f"run_dir={run_dir}", "split=test",
                           "backend=cpu_onednn"], out / f"{res}.log")
            study["runs"][res] = {"train_s": round(train_s), "evaluate_s": round(eval_s)}
        if summary_path.is_file():
            summary = json.loads(summary_path.read_text())
            state = folder.read_state()
            study["runs"].setdefault(res, {}).update(
                label=res, spacing_mm=SPACING_MM[res], epochs=int(state["epoch"]), n_cases=summary["n_cases"],
                **{k: v for k, v in summary.items() if k.startswith(("dice_", "hd95_"))})
        write_text_atomic(study_path, json.dumps(study, indent=1) + "\n")  # read back by plot_only=true and reruns
    rows = [r for r in study["runs"].values() if "dice_wt" in r]
    if not rows:
        raise SystemExit(f"error: no evaluated run under {out} yet")
    png = plot_resolution_study(rows, out / "resolution_study.png",
                                title=f"{args['data']}: Dice on the native grid against training resolution "
                                      f"({precision}, {cpu_kind()})")
    print("\n| resolution | spacing | epochs | test cases | Dice WT | Dice TC | Dice ET | HD95 WT (mm) |")
    print("|---|---|---|---|---|---|---|---|")
    for r in sorted(rows, key=lambda r: -r["spacing_mm"]):
        cells = [f"{r[f'dice_{x}']['mean']:.3f} ± {r[f'dice_{x}']['std']:.3f}" for x in ("wt", "tc", "et")]
        print(f"| {r['label']} | {r['spacing_mm']:g} mm | {r['epochs']} | {r['n_cases']} | {' | '.join(cells)} "
              f"| {r['hd95_wt']['median']:.1f} |")
    print(f"\nwrote {study_path} and {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
