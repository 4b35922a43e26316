#!/usr/bin/env python
"""Score a training run on its held-out cases, on the native grid of the original label files.

    python scripts/evaluate.py run_dir=outputs/<run>                       # test split, best checkpoint
    python scripts/evaluate.py run_dir=outputs/<run> split=val checkpoint=last
    python scripts/evaluate.py run_dir=outputs/<run> evaluate.mode=sliding evaluate.window=[96,96,96]
    python scripts/evaluate.py run_dir=outputs/<run> on=mni_gliomas_shifted   # the same cases, another scanner
    python scripts/evaluate.py run_dir=outputs/<run> evaluate.postprocess=none   # masks as thresholded
    python scripts/evaluate.py run_dir=outputs/folds/ensemble 'runs=[outputs/folds/fold_0,outputs/folds/fold_1]'

Prints the means per region of the legacy Dice/HD95, the BraTS 2023-24 lesion-wise ranking
metrics and today's official lesion-wise Dice/NSD/HD95 (panoptica), and where the files are:
``<run_dir>/eval/<split>/{metrics.csv, summary.json, predictions/, overlays/}``; logs
them to the run's MLflow run. The masks are post-processed first (``evaluate.postprocess=auto``):
small components removed and a small ET relabelled as necrosis, with thresholds chosen on the run's
val split and kept in ``<run_dir>/postprocess.json`` (chosen again for a new checkpoint or other
inference settings). ``on=<data config>`` scores the split's cases as another dataset
holds them (same ids and layout) into ``eval/<split>@<on>/``. Exits 2 with a message on a run folder without a
config.json or checkpoint, a bad split, or bad data. SIGTERM/SIGINT stop it with exit status 75;
the same command then continues with the cases not evaluated yet (``eval/<split>/cases/``).

``runs=[...]`` makes ``run_dir`` the ensemble of those runs (their probabilities averaged;
``brats_seg.evaluation.inference.ensemble``), or checks it is: of the folds of a cross-validation,
``split=val`` scores each fold's val cases with the fold that held them out, and post-processing is
chosen on all of them together; ``split=test`` scores the ensemble. Afterwards ``run_dir=`` alone
evaluates it again.
"""

from __future__ import annotations

from pathlib import Path

from brats_seg.cli import given_override, hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "evaluate")
def main(cfg) -> None:
    conf = to_config(cfg)
    # TensorFlow-free checks first: a wrong run_dir fails in a second, not after the TF import.
    from brats_seg.evaluation.inference.start import start_inference

    with user_errors("evaluation"):
        if conf.runs:
            from brats_seg.evaluation.inference.ensemble import make_ensemble

            make_ensemble(conf.run_dir, conf.runs, conf.checkpoint)
        start = start_inference(
            conf.run_dir, conf.checkpoint, conf.evaluate, conf.backend, given_override("backend.precision"), conf.split
        )
        other = _data_config(conf.on) if conf.on else None
    settings = start.evaluate  # a patch run: windows of its patch

    from brats_seg.backend import configure

    with user_errors("evaluation"):
        configure(start.backend)
    from brats_seg.data.labels import region_names
    from brats_seg.evaluation.evaluate import eval_dir, evaluate_run
    from brats_seg.evaluation.inference.run import load_run_config
    from brats_seg.evaluation.scoring.table import format_summary_table

    with user_errors("evaluation"):
        summary = evaluate_run(conf.run_dir, conf.split, conf.checkpoint, settings, data=other)
    layout = load_run_config(conf.run_dir).data.layout
    out = eval_dir(conf.run_dir, f"{conf.split}@{conf.on}" if conf.on else conf.split)
    mode = f"sliding-window ({'x'.join(map(str, settings.window))})" if settings.mode == "sliding" else "whole-volume"
    print(
        f"\nevaluated {summary['n_cases']} {conf.split} case(s) of {conf.run_dir} "
        f"(checkpoint {conf.checkpoint}, {mode} inference, threshold {settings.threshold}):\n"
    )
    print(format_summary_table(summary, region_names(layout)))
    _print_postprocessing(summary, region_names(layout), Path(conf.run_dir))
    print(f"\n  metrics      {out / 'metrics.csv'}")
    print(f"  summary      {out / 'summary.json'}")
    print(f"  predictions  {out / 'predictions'}/<case_id>.nii.gz")
    if settings.overlays:
        print(f"  overlays     {out / 'overlays'}/<case_id>.png")


def _print_postprocessing(summary: dict, regions, run_dir: Path) -> None:
    """What the post-processing was and what it changed on this split (means before -> after)."""
    applied = summary.get("postprocess")
    if not applied:
        print("\npost-processing: none (masks as thresholded)")
        return
    print(
        f"\npost-processing: {applied['described']} (chosen on the val split: {run_dir / 'postprocess.json'}); "
        f"it changed {applied['cases_changed']} of {summary['n_cases']} masks"
    )
    before = applied["unprocessed_mean"]
    for column, title in (
        ("dice", "Dice"),
        ("lesion23_dice", "lesion-wise Dice (2023)"),
        ("lesion_dice", "lesion-wise Dice (panoptica)"),
    ):
        cells = [
            f"{r.upper()} {before[f'{column}_{r}']:.3f} -> {summary[f'{column}_{r}']['mean']:.3f}"
            for r in regions
            if before.get(f"{column}_{r}") is not None
        ]
        if cells:
            print(f"  {title:29s} " + ", ".join(cells))


def _data_config(name: str):
    """``configs/data/<name>.yaml`` as a DataConfig (``on=``)."""
    from omegaconf import OmegaConf

    from brats_seg.config import DataConfig
    from brats_seg.data.dataset import GENERATED
    from brats_seg.data.layouts import check_dataset_root

    folder = Path(__file__).resolve().parents[1] / "configs" / "data"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in folder.glob("*.yaml")))
        raise ValueError(f"on={name}: no such data config; use one of {names}.")
    data = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.load(path)))
    if data.name not in GENERATED:  # generated ones are written on first use
        if not str(data.root).strip():
            raise ValueError(
                f"on={name}: configs/data/{name}.yaml sets no root; copy it with root: set to the "
                "other dataset's folder and pass on=<its name>."
            )
        check_dataset_root(data.root, data.layout, key=f"root in configs/data/{name}.yaml")
    return data


if __name__ == "__main__":
    main()
