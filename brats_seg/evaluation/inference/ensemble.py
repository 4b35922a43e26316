"""An ensemble of trained runs: their probabilities averaged, evaluated and used like one run.

    python scripts/evaluate.py run_dir=outputs/folds/ensemble 'runs=[outputs/folds/fold_0,...]'
    python scripts/predict.py run_dir=outputs/folds/ensemble input=... output=...

``runs=`` makes (or checks) an **ensemble's folder** at ``run_dir``: ``ensemble.json`` names the
member runs and their checkpoints' identities, ``config.json`` is the first member's and
``split.json`` is the members' together: the test cases they share, and

- for the folds of one cross-validation (the members' val parts disjoint): every fold's val cases,
  each predicted by the member that held it out, so ``split=val`` scores the cross-validation
  predictions and post-processing is chosen on all of them together, as nnU-Net chooses it;
- for runs on the same split (e.g. seeds; identical val parts): that val split, predicted by the
  ensemble.

From then on the folder is read as a run (:class:`~brats_seg.run_dir.RunFolder`): ``evaluate.py``
and ``predict.py`` take it as ``run_dir=`` and write ``postprocess.json`` and ``eval/`` into it.
Members must share the layout, regions, input channels, resolution (grid and spacing), patch
(inference windows) and the test split; anything else is refused, naming the runs that differ.

Each case runs through the members one after the other (one forward pass in memory at a time) and
the running sum of their float32 probabilities is kept on the network grid: the memory of an
ensemble is one member's inference, the other members' weights, and one more probability volume
(:func:`~brats_seg.lms.planner.inference.estimate_inference`, ``members``). Nothing here imports
TensorFlow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from brats_seg.config import TrainConfig
from brats_seg.evaluation.inference.ensemble_model import Ensemble, member_for
from brats_seg.run_dir import CHECKPOINTS, RunError, RunFolder

__all__ = ["ENSEMBLE_KIND", "Ensemble", "ensemble_size", "make_ensemble", "member_for"]

log = logging.getLogger(__name__)

ENSEMBLE_KIND = "brats_seg_ensemble"


def ensemble_size(run_dir: str | Path) -> int:
    """Member runs of ``run_dir`` (1 for a training run)."""
    return max(1, len(RunFolder(Path(run_dir).expanduser()).ensemble_members()))


def _same(configs: list[tuple[Path, TrainConfig]], what: str, get) -> None:
    first_dir, first = configs[0]
    for run_dir, cfg in configs[1:]:
        if get(cfg) != get(first):
            raise RunError(
                f"runs=: {run_dir} has {what} {get(cfg)}, {first_dir} has {get(first)}; an ensemble averages "
                "probabilities of one grid and the same regions: ensemble runs trained alike."
            )


def make_ensemble(run_dir: str | Path, runs: Sequence[str], checkpoint: str = "best") -> Path:
    """Make (or check) the ensemble's folder ``run_dir`` of the trained ``runs`` (TensorFlow-free).

    Returns:
        The folder.

    Raises:
        RunError: fewer than two runs, a run that cannot be evaluated, members that differ in layout,
            regions, channels, resolution or test split, val parts that partly overlap, ``run_dir``
            being a training run or another ensemble's folder.
    """
    from brats_seg.evaluation.inference.run import load_run_config, run_regions
    from brats_seg.patch_schedule import inference_patch

    folder = RunFolder(Path(run_dir).expanduser())
    members = [Path(r).expanduser().resolve() for r in runs]
    if len(members) < 2:
        raise RunError(f"runs={list(runs)}: an ensemble needs two or more run folders.")
    if len(set(members)) < len(members):
        raise RunError(f"runs={list(runs)} names a run twice.")
    if folder.root.resolve() in members:
        raise RunError(f"run_dir={run_dir} is one of runs=: give the ensemble a folder of its own.")
    if checkpoint not in CHECKPOINTS:
        raise RunError(f"checkpoint={checkpoint!r}: an ensemble loads each member's best or last checkpoint.")
    configs = []
    for member in members:
        if RunFolder(member).ensemble_members():
            raise RunError(f"runs=: {member} is an ensemble's folder; name its member runs instead.")
        configs.append((member, load_run_config(member)))
        RunFolder(member).checkpoint(checkpoint)
    _same(configs, "the layout", lambda c: str(c.data.layout))
    _same(configs, "the regions", lambda c: list(run_regions(c)))
    _same(configs, "the input channels", lambda c: c.model.in_channels)
    _same(configs, "the grid", lambda c: [list(c.resolution.shape), c.resolution.spacing_mm])
    _same(configs, "the inference patch", lambda c: inference_patch(c))
    splits = [RunFolder(m).read_split() for m in members]
    for m, sp in zip(members[1:], splits[1:]):
        if sorted(sp.get("test", [])) != sorted(splits[0].get("test", [])):
            raise RunError(
                f"runs=: {m} and {members[0]} hold out different test cases; an ensemble is scored on the "
                "test cases its members share, so ensemble runs of one split (or its folds)."
            )
    vals = [set(sp.get("val", [])) for sp in splits]
    if all(v == vals[0] for v in vals):
        val, val_by = sorted(vals[0]), {}
    elif all(not (vals[i] & vals[j]) for i in range(len(vals)) for j in range(i + 1, len(vals))):
        val_by = {c: i for i, v in enumerate(vals) for c in sorted(v)}
        val = sorted(val_by)
    else:
        raise RunError(
            f"runs=: the members' val cases partly overlap ({', '.join(str(m) for m in members)}): neither the "
            "folds of one cross-validation (disjoint val parts) nor runs on one split (the same val cases)."
        )
    record = {
        "kind": ENSEMBLE_KIND,
        "checkpoint": checkpoint,
        "members": [{"run_dir": str(m)} for m in members],
        "val": "out_of_fold" if val_by else "shared",
    }
    existing = folder.ensemble_members()
    if existing:
        if [str(m.root) for m in existing] != [str(m) for m in members]:
            raise RunError(
                f"{folder.ensemble_path} is an ensemble of other runs; give this one another run_dir= "
                "(or delete the folder)."
            )
    elif folder.has_config():
        raise RunError(f"run_dir={run_dir} is a training run; give the ensemble a folder of its own.")
    split = {
        "ensemble": [str(m) for m in members],
        "train": sorted({c for sp in splits for c in sp.get("train", [])} - set(val) - set(splits[0]["test"])),
        "val": val,
        "test": sorted(splits[0]["test"]),
        **({"val_predicted_by": {c: str(members[i]) for c, i in val_by.items()}} if val_by else {}),
    }
    folder.root.mkdir(parents=True, exist_ok=True)
    folder.write_split(split)
    folder.write_config(configs[0][1])
    from brats_seg.files import write_text_atomic

    write_text_atomic(folder.ensemble_path, json.dumps(record, indent=1))  # last: the folder is complete
    log.info(
        "ensemble of %d runs in %s (%s val: %d cases)",
        len(members),
        folder.root,
        "out-of-fold" if val_by else "shared",
        len(val),
    )
    return folder.root
