"""Case records: an interrupted evaluation continues where it stopped.

Each case :func:`brats_seg.evaluation.evaluate.evaluate_run` scores gets a record in
``eval/<split>/cases/<case_id>.json`` (written last, atomically): a fingerprint of what its result
depends on (the checkpoint, the inference precision, the ``evaluate.*`` values, the layout and
regions, the post-processing, the cache entry), the identity of the files it wrote, and its metrics
rows. The same evaluation again reuses the rows whose record still holds and whose files are the
ones in place.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from pathlib import Path

from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.data.cache import CacheEntry
from brats_seg.evaluation.inference.run import run_regions
from brats_seg.evaluation.postprocess import PostProcessing
from brats_seg.files import file_identity
from brats_seg.run_dir import RunFolder

__all__ = [
    "RECORD_VERSION",
    "case_fingerprint",
    "case_outputs",
    "decode_row",
    "encode_row",
    "evaluation_key",
    "record_case",
    "reusable_row",
]

RECORD_VERSION = 2  # bump when scoring changes: every case is evaluated again (2: post-processing)


def evaluation_key(
    checkpoint_identity: dict | None,
    eval_cfg: EvaluateConfig,
    config: TrainConfig,
    postprocess: PostProcessing | None = None,
    policy: str = "float32",
) -> dict | None:
    """What every case's result depends on besides its own entry (the precision the model infers in,
    ``policy``, among it); None (nothing reused) for a model in memory."""
    if checkpoint_identity is None:
        return None
    return {
        "version": RECORD_VERSION,
        "checkpoint": checkpoint_identity,
        "policy": policy,
        "evaluate": dataclasses.asdict(eval_cfg),
        "layout": str(config.data.layout),
        "regions": list(run_regions(config)),
        "postprocess": None if postprocess is None else postprocess.rules(),
    }


def case_fingerprint(key: dict, entry: CacheEntry) -> str:
    """The key and the cache entry's own fingerprint together: a record holds while both are the same."""
    entry_fingerprint = entry.meta.get("fingerprint")
    return hashlib.sha256(json.dumps({**key, "entry": entry_fingerprint}, sort_keys=True).encode()).hexdigest()


def case_outputs(folder: RunFolder, split: str, case_id: str, overlays: bool) -> dict:
    """The identity of the files a case's evaluation wrote (None where a file is missing)."""
    return {
        "prediction": file_identity(folder.prediction_file(split, case_id)),
        "overlay": file_identity(folder.overlay_file(split, case_id)) if overlays else None,
    }


def encode_row(row: dict) -> dict:
    """A metrics row as JSON: NaN (undefined) as null, infinite distances as "inf"; floats at full precision."""
    return {
        k: None if math.isnan(v) else (("inf" if v > 0 else "-inf") if math.isinf(v) else v)
        for k, v in ((k, float(v)) for k, v in row.items() if k != "case_id")
    }


def decode_row(row: dict) -> dict:
    """A row as :func:`encode_row` wrote it, as floats again (null as NaN, "inf" as infinity)."""
    return {k: math.nan if v is None else float(v) for k, v in row.items()}


def reusable_row(
    folder: RunFolder, split: str, case_id: str, fingerprint: str, overlays: bool
) -> tuple[dict, dict | None] | None:
    """The case's metrics row (and its unprocessed row, or None) from its record, if the record was
    made by the same checkpoint, settings and entry and the files it recorded are the ones in place;
    else None."""
    record = folder.read_eval_case(split, case_id)
    if record is None or record.get("fingerprint") != fingerprint:
        return None
    outputs = case_outputs(folder, split, case_id, overlays)
    recorded = record.get("outputs") or {}
    if outputs["prediction"] is None or outputs["prediction"] != recorded.get("prediction"):
        return None
    if overlays and (outputs["overlay"] is None or outputs["overlay"] != recorded.get("overlay")):
        return None
    try:
        unprocessed = record.get("unprocessed")
        return decode_row(record["metrics"]), (None if unprocessed is None else decode_row(unprocessed))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def record_case(
    folder: RunFolder, split: str, case_id: str, fingerprint: str, overlays: bool, row: dict, raw: dict | None
) -> Path:
    """Write the case's record (``eval/<split>/cases/<case_id>.json``) once its files are written:
    the fingerprint, the identity of its prediction (and overlay), its metrics row and the row as
    thresholded (``raw``; None: post-processing changed nothing)."""
    return folder.write_eval_case(
        split,
        case_id,
        {
            "case_id": case_id,
            "fingerprint": fingerprint,
            "outputs": case_outputs(folder, split, case_id, overlays),
            "metrics": encode_row(row),
            "unprocessed": None if raw is None else encode_row(raw),
        },
    )
