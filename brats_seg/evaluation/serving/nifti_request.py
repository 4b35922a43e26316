"""A served model's NIfTI request: a case as its four NIfTI files (paths or bytes) in, its label map out.

The MLflow model (:mod:`brats_seg.tracking.pyfunc_model`) takes either a volume already on the
run's network grid (its SavedModel's probabilities, brats_seg not needed) or raw cases, which it
hands here: ``scripts/predict.py export=<export>``'s path for each case
(:func:`brats_seg.evaluation.inference.predict.segment_case`: the run's preprocessing, the
model, the native grid, the threshold, the post-processing the export holds), so a served
case's label map is the file ``predict.py`` writes for it, byte for byte the same array.

A request is one case or several: a pandas DataFrame (one row per case; MLflow's
``dataframe_records``/``dataframe_split``), a dict (one case; or lists of equal length, one item
per case; MLflow's ``inputs``) or a list of dicts. Each case has the four contrasts under
``flair``, ``t1``, ``t1ce``, ``t2`` (or BraTS 2023's ``t2f``, ``t1n``, ``t1c``, ``t2w``) and an
optional ``case_id``. A contrast is a path the server can read, or the file's bytes: ``bytes``
from Python, base64 text over HTTP (MLflow's JSON carries no bytes). The answer is a DataFrame,
one row per case: ``case_id`` and ``labels``, the gzipped NIfTI label map on the case's own grid
with its first file's affine and header (the run's label values, or ``labels``'s), and with
``probabilities`` asked for, ``probabilities``: a gzipped float32 NIfTI ``(x, y, z, R)`` of the
regions' sigmoid on that grid (``regions`` in ``preprocessing.json``). Over HTTP bytes come back
as base64 text.

Every bad request raises :class:`RequestError` with one line naming the case and the contrast
(its path, or "sent as bytes"): a missing contrast, a value that is neither a readable file nor
base64, a file that is not NIfTI, contrasts on different grids. The served model answers it
with HTTP 400 and that line.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.data.errors import CaseError
from brats_seg.data.layouts import CHANNELS, Case
from brats_seg.evaluation.inference.predict import check_labels, segment_case
from brats_seg.evaluation.inference.run import RunError
from brats_seg.evaluation.postprocess import PostProcessing
from brats_seg.evaluation.serving.exported import (
    ExportedModel,
    ExportInfo,
    check_export_settings,
    prediction_postprocessing,
    read_export,
)
from brats_seg.files import atomic_path, write_bytes_atomic

__all__ = ["CONTRASTS", "NiftiServer", "RequestError", "request_cases"]

log = logging.getLogger(__name__)

CONTRASTS = CHANNELS  # flair, t1, t1ce, t2: a case's keys in a request
_ALIASES = {"t2f": "flair", "t1n": "t1", "t1c": "t1ce", "t2w": "t2"}  # BraTS 2023's names for them
_GZIP_MAGIC = b"\x1f\x8b"
_CASE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_FORMS = (
    "send a case as {flair, t1, t1ce, t2} (each a path the server can read, or the file's bytes; base64 "
    "text over HTTP), one per row of a DataFrame (dataframe_records), a dict (inputs), or a list of dicts"
)


class RequestError(ValueError):
    """A request the model cannot segment: one line naming the case and the contrast."""


@dataclass(frozen=True)
class _Contrast:
    path: Path  # where the file is (the client's path, or the bytes written to the request's folder)
    origin: str  # how the client sent it, for messages: its path, or "sent as bytes"


def _records(model_input) -> list[dict]:
    """The request as one dict per case."""
    if hasattr(model_input, "to_dict") and hasattr(model_input, "columns"):  # a pandas DataFrame
        return [dict(r) for r in model_input.to_dict("records")]
    if isinstance(model_input, Mapping):
        values = {str(k): _plain(v) for k, v in model_input.items()}
        lists = {k: v for k, v in values.items() if isinstance(v, list)}
        if not lists:
            return [values]
        lengths = {len(v) for v in lists.values()}
        if len(lists) != len(values) or len(lengths) != 1:
            raise RequestError(f"the request's keys hold lists of different lengths: {_FORMS}.")
        return [{k: v[i] for k, v in lists.items()} for i in range(lengths.pop())]
    if isinstance(model_input, Sequence) and not isinstance(model_input, str | bytes):
        if model_input and all(isinstance(r, Mapping) for r in model_input):
            return [{str(k): _plain(v) for k, v in r.items()} for r in model_input]
    raise RequestError(f"a request of type {type(model_input).__name__} holds no case: {_FORMS}.")


def _plain(value):
    """A numpy value as Python's (MLflow parses JSON ``inputs`` into numpy arrays)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def _case_id(record: dict, index: int) -> str:
    value = record.get("case_id")
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return f"case_{index}"
    case_id = str(value).strip()
    if not _CASE_ID.match(case_id):
        raise RequestError(
            f"case_id {case_id!r}: use letters, digits, '.', '_' and '-' only (it names the case's files)."
        )
    return case_id


def _is_file(text: str) -> bool:
    """Whether ``text`` names a file the server can read (base64 text names none: too long a name)."""
    try:
        return Path(text).expanduser().is_file()
    except (OSError, ValueError):  # a name too long for the file system, a NUL
        return False


def _contrast(case_id: str, key: str, value, folder: Path) -> _Contrast:
    """One contrast as a file: the client's path, or its bytes (base64 text decoded) written to ``folder``."""
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise RequestError(f"case {case_id}: {key} is empty: {_FORMS}.")
        if _is_file(text):
            return _Contrast(Path(text).expanduser(), text)
        try:
            data = base64.b64decode(text, validate=False)
        except (binascii.Error, ValueError):
            data = b""
        if len(data) < 348:  # shorter than a NIfTI header: not base64 of a file either
            raise RequestError(
                f"case {case_id}: {key} {text[:80]!r}{'...' if len(text) > 80 else ''} is neither a file the "
                "server can read nor base64 of a NIfTI file."
            )
        value = data
    if not isinstance(value, bytes | bytearray | memoryview):
        raise RequestError(f"case {case_id}: {key} is a {type(value).__name__}: {_FORMS}.")
    data = bytes(value)
    path = write_bytes_atomic(folder / f"{case_id}_{key}.nii{'.gz' if data[:2] == _GZIP_MAGIC else ''}", data)
    return _Contrast(path, "sent as bytes")


def request_cases(model_input, folder: Path) -> tuple[list[Case], dict[str, str]]:
    """The cases a request holds, their sent bytes written under ``folder``.

    Returns:
        The cases (images in FLAIR, T1, T1ce, T2 order) and, per file path, how the client
        named it (for messages).

    Raises:
        RequestError: no case, an unknown key, a missing contrast, a value that is neither a
            readable file nor bytes, or two cases with one id.
    """
    cases, origins = [], {}
    for index, record in enumerate(_records(model_input)):
        case_id = _case_id(record, index)
        named = {}
        for key, value in record.items():
            contrast = _ALIASES.get(str(key).lower(), str(key).lower())
            if contrast == "case_id":
                continue
            if contrast not in CONTRASTS:
                raise RequestError(f"case {case_id}: unknown key {key!r}: {_FORMS}.")
            if contrast in named:
                raise RequestError(f"case {case_id}: {contrast} is given twice ({key!r} and its other name).")
            named[contrast] = value
        missing = [c for c in CONTRASTS if c not in named or named[c] is None]
        if missing:
            raise RequestError(
                f"case {case_id}: missing {', '.join(missing)}: a case needs all four contrasts "
                f"({', '.join(CONTRASTS)})."
            )
        case_folder = folder / f"{index:04d}"
        case_folder.mkdir(parents=True, exist_ok=True)
        files = [_contrast(case_id, c, named[c], case_folder) for c in CONTRASTS]
        origins.update({str(f.path): f"{c} ({f.origin})" for c, f in zip(CONTRASTS, files)})
        cases.append(Case(case_id, "brats2021", tuple(f.path for f in files), None))
    ids = [c.case_id for c in cases]
    if len(set(ids)) != len(ids):
        raise RequestError(f"case ids {sorted({i for i in ids if ids.count(i) > 1})} occur more than once.")
    return cases, origins


def _named(message: str, origins: dict[str, str]) -> str:
    """A message with the request's temporary file paths replaced by how the client sent them."""
    for path, origin in origins.items():
        message = message.replace(path, origin)
    return " ".join(message.split())  # one line


class NiftiServer:
    """An export segmenting raw cases as ``scripts/predict.py export=<export>`` does.

    Args:
        info: the export (:func:`~brats_seg.evaluation.serving.exported.read_export`).
        model: its loaded SavedModel (:class:`~brats_seg.evaluation.serving.exported.ExportedModel`).
        eval_cfg: the inference settings (``predict.py``'s defaults: whole volume, test-time mirroring).
    """

    def __init__(self, info: ExportInfo, model: ExportedModel, eval_cfg: EvaluateConfig | None = None) -> None:
        self.info, self.model = info, model
        self.settings = eval_cfg or EvaluateConfig(overlays=False)
        check_export_settings(info, self.settings)
        self.config: TrainConfig = info.config
        self.postprocess: PostProcessing | None = prediction_postprocessing("", info, info.config, self.settings)

    @classmethod
    def load(cls, folder: str | Path, loaded=None) -> NiftiServer:
        """The server of the export in ``folder``; ``loaded``: its SavedModel, if already loaded."""
        from brats_seg.evaluation.serving.exported import load_exported_model

        info = read_export(folder)
        model = load_exported_model(folder) if loaded is None else ExportedModel(loaded, Path(folder))
        return cls(info, model)

    def segment(self, model_input, probabilities: bool = False, labels: str = ""):
        """Segment every case of a request (module doc); a pandas DataFrame, one row per case.

        Raises:
            RequestError: a bad request or a bad case (one line naming the case and the contrast).
        """
        import pandas as pd

        check_labels(labels, RequestError)
        rows = []
        with tempfile.TemporaryDirectory(prefix="brats-seg-request-") as tmp:
            cases, origins = request_cases(model_input, Path(tmp))
            for case in cases:
                try:
                    seg = segment_case(self.model, case, self.config, self.settings, self.postprocess, labels)
                except (CaseError, RunError) as e:
                    raise RequestError(_named(str(e), origins)) from None
                row = {"case_id": case.case_id, "labels": _mask_bytes(seg, Path(tmp))}
                if probabilities:
                    row["probabilities"] = _probability_bytes(seg, Path(tmp))
                rows.append(row)
                log.info("segmented %s (%s)", case.case_id, "x".join(map(str, seg.labels.shape)))
        return pd.DataFrame(rows, columns=["case_id", "labels", *(["probabilities"] if probabilities else [])])


def _mask_bytes(seg, folder: Path) -> bytes:
    """The label map as the gzipped NIfTI ``predict.py`` writes (:func:`~brats_seg.data.nifti.save_mask`)."""
    from brats_seg.data.nifti import save_mask

    path = save_mask(seg.labels, seg.ref.original_affine, seg.ref.original_header, folder / "labels.nii.gz")
    data = path.read_bytes()
    path.unlink()
    return data


def _probability_bytes(seg, folder: Path) -> bytes:
    """The native-grid probabilities ``(x, y, z, R)`` as a gzipped float32 NIfTI in the case's orientation."""
    import nibabel as nib

    from brats_seg.data.nifti import to_original_orientation

    data = to_original_orientation(np.asarray(seg.probabilities, np.float32), seg.ref.original_affine)
    header = seg.ref.original_header.copy()
    header.set_data_dtype(np.float32)
    image = nib.Nifti1Image(data, seg.ref.original_affine, header=header)
    image.header.set_slope_inter(1.0, 0.0)
    path = folder / "probabilities.nii.gz"
    with atomic_path(path, suffix=".nii.gz") as tmp:
        nib.save(image, tmp)
    data_bytes = path.read_bytes()
    path.unlink()
    return data_bytes
