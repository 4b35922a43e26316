"""``predict.json``: what lets the same ``scripts/predict.py`` command continue where it stopped.

The manifest in the output folder records the model (the run's config and the checkpoint's size
and SHA-256, or an export's identity), the ``evaluate.*`` values, the post-processing, the label
values when they are not the run's, and per case its input files' identity and the mask (and
overlay) it wrote. :func:`brats_seg.evaluation.inference.predict.predict_new_cases` writes it
atomically after each case and skips the cases whose record still holds.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path

from brats_seg.config import EvaluateConfig, TrainConfig, config_to_dict
from brats_seg.data.layouts import Case
from brats_seg.evaluation.postprocess import PostProcessing
from brats_seg.files import file_identity, is_temporary, write_text_atomic

__all__ = [
    "MANIFEST",
    "already_predicted",
    "case_record",
    "manifest_settings",
    "mask_path",
    "overlay_path",
    "read_manifest",
    "remove_leftovers",
    "write_manifest",
]

log = logging.getLogger(__name__)

MANIFEST = "predict.json"  # in the output folder: which model and settings wrote which masks
_MANIFEST_VERSION = 1


def mask_path(output: Path, case_id: str) -> Path:
    return output / f"{case_id}.nii.gz"


def overlay_path(output: Path, case_id: str) -> Path:
    return output / "overlays" / f"{case_id}.png"


def manifest_settings(
    config: TrainConfig,
    eval_cfg: EvaluateConfig,
    model_identity: dict,
    postprocess: PostProcessing | None = None,
    labels: str = "",
) -> dict:
    """What every mask depends on besides its case: the model, the settings, the post-processing
    and the label values (a layout other than the run's; none recorded for the run's own, so a
    manifest written before ``labels=`` existed still holds)."""
    run = hashlib.sha256(json.dumps(config_to_dict(config), sort_keys=True, default=str).encode()).hexdigest()
    return {
        "version": _MANIFEST_VERSION,
        "model": model_identity,
        "run_config_sha256": run,
        "evaluate": dataclasses.asdict(eval_cfg),
        "postprocess": None if postprocess is None else postprocess.rules(),
        **({"labels": labels} if labels and labels != config.data.layout else {}),
    }


def read_manifest(output: Path, settings: dict) -> dict[str, dict]:
    """The cases ``predict.json`` records for these settings (empty for none, other settings, or
    an unreadable file)."""
    path = output / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        log.warning("%s cannot be read (%s): predicting every case again", path, e)
        return {}
    if not isinstance(manifest, dict) or manifest.get("settings") != json.loads(json.dumps(settings)):
        log.info("%s was written by another model or with other settings: predicting every case again", path)
        return {}
    cases = manifest.get("cases")
    return cases if isinstance(cases, dict) else {}


def write_manifest(output: Path, settings: dict, cases: dict[str, dict]) -> Path:
    """``predict.json`` with ``settings`` and the records of the ``cases`` done (atomically: a
    reader sees the previous manifest or this one)."""
    return write_text_atomic(output / MANIFEST, json.dumps({"settings": settings, "cases": cases}, indent=1))


def case_record(case: Case, output: Path, overlays: bool) -> dict:
    return {
        "inputs": [[str(p.resolve()), *(file_identity(p) or [])] for p in case.images],
        "mask": file_identity(mask_path(output, case.case_id)),
        "overlay": file_identity(overlay_path(output, case.case_id)) if overlays else None,
    }


def already_predicted(case: Case, output: Path, overlays: bool, done: dict[str, dict]) -> bool:
    """Whether ``case``'s mask (and overlay) in place were written from these inputs by this model
    and these settings."""
    record = done.get(case.case_id)
    if not isinstance(record, dict):
        return False
    now = case_record(case, output, overlays)
    return (
        now["mask"] is not None
        and (not overlays or now["overlay"] is not None)
        and now == {k: record.get(k) for k in now}
    )


def remove_leftovers(output: Path) -> None:
    """Temporary files of a prediction killed in ``output`` (ours: the folder's lock is held)."""
    found = [
        p
        for folder in (output, output / "overlays")
        if folder.is_dir()
        for p in folder.iterdir()
        if is_temporary(p) and p.is_file()
    ]
    for p in found:
        p.unlink(missing_ok=True)
    if found:
        log.info("removed %d temporary file(s) left by an interrupted prediction in %s", len(found), output)
