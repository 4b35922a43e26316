"""A run's data as MLflow dataset inputs: each split one dataset, named, fingerprinted, described.

MLflow shows a run's inputs in its runs list (the Dataset column: name, digest and context) and
in a drawer (source and profile), and ``search_runs`` filters on them
(``dataset.name = 'synthetic/train'``, ``dataset.digest = '...'``, ``dataset.context = 'evaluation'``).
Here a split of the run's ``split.json`` is one dataset:

* **name** ``<data.name>/<split>``: ``synthetic/train``, ``synthetic/val``, ``synthetic/test``; the
  split an evaluation scored is ``<data.name>/eval/<split>`` (``synthetic/eval/test``,
  ``mni_gliomas_shifted/eval/test``). It is a dataset of its own because MLflow keeps one input
  per dataset and run: logging ``synthetic/test`` again with context ``evaluation`` would be
  dropped as a duplicate of training's input.
* **digest**: 8 hex of the SHA-256 of what the split's cached cases are: the cache folder of the
  data root (:func:`~brats_seg.data.dataset.dataset_cache_dir`: ``data.name`` and a hash of the
  root), the layout, the resolution (name, spacing, shape), the preprocessing version and the
  split's case ids. So it differs between splits and resolutions and stays the same for every
  run of the same data; the same cases evaluated have the digest of the split they came from.
* **source**: the data root (MLflow's local filesystem source).
* **profile** (MLflow's drawer shows it): ``cases`` (the split's case count), ``layout``,
  ``resolution``, ``spacing_mm`` and ``shape``.
* **context** (the input tag ``mlflow.data.context``): ``train``, ``validation``, ``test``, or
  ``evaluation``.

Built with MLflow's own classes (a :class:`~mlflow.data.meta_dataset.MetaDataset`: metadata only,
no data is copied) and handed to :meth:`~brats_seg.tracking.Tracker.log_datasets` as
``mlflow.entities.DatasetInput``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from mlflow.data.meta_dataset import MetaDataset
from mlflow.data.sources import LocalArtifactDatasetSource
from mlflow.entities import Dataset, DatasetInput, InputTag

from brats_seg.config import DataConfig, ResolutionConfig
from brats_seg.data.cache import PREPROCESS_VERSION
from brats_seg.data.dataset import dataset_cache_dir

__all__ = ["CONTEXT_TAG", "SPLIT_CONTEXTS", "evaluated_input", "split_inputs"]

CONTEXT_TAG = "mlflow.data.context"  # the input tag MLflow's runs list shows beside the name
# split.json's splits -> their context, in the order a run lists them
SPLIT_CONTEXTS = {"train": "train", "val": "validation", "test": "test"}
EVALUATION_CONTEXT = "evaluation"


def split_inputs(
    data: DataConfig, resolution: ResolutionConfig, split: Mapping[str, Sequence[str]]
) -> list[DatasetInput]:
    """The training run's splits as MLflow dataset inputs (train, validation, test; an empty split is left out).

    Args:
        data: the run's ``data.*``.
        resolution: the run's ``resolution.*``.
        split: ``split.json``: ``{"train": [case ids], "val": [...], "test": [...]}``.
    """
    return [
        _dataset_input(f"{data.name}/{name}", data, resolution, split[name], context)
        for name, context in SPLIT_CONTEXTS.items()
        if split.get(name)
    ]


def evaluated_input(
    data: DataConfig, resolution: ResolutionConfig, split: str, case_ids: Sequence[str]
) -> DatasetInput:
    """The cases an evaluation scored, as the MLflow dataset input ``<data.name>/eval/<split>``.

    Args:
        data: the data the cases were read from (the run's, or another one: ``evaluate ... data=``).
        resolution: the run's ``resolution.*`` (the cached images the model saw).
        split: ``val`` | ``test`` | ``all``.
        case_ids: the cases scored.
    """
    return _dataset_input(f"{data.name}/eval/{split}", data, resolution, case_ids, EVALUATION_CONTEXT)


def compute_digest(data: DataConfig, resolution: ResolutionConfig, case_ids: Sequence[str]) -> str:
    """8 hex characters identifying ``case_ids`` of ``data`` cached at ``resolution`` (see the module doc)."""
    key = {
        "cache": dataset_cache_dir(data).name,  # <data.name>_<8 hex of the resolved root>
        "layout": str(data.layout),
        "resolution": [resolution.name, float(resolution.spacing_mm), [int(s) for s in resolution.shape]],
        "preprocess_version": PREPROCESS_VERSION,
        "cases": sorted(case_ids),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:8]


def _dataset_input(
    name: str, data: DataConfig, resolution: ResolutionConfig, case_ids: Sequence[str], context: str
) -> DatasetInput:
    source = LocalArtifactDatasetSource(str(Path(data.root).expanduser().resolve()))
    dataset = MetaDataset(source, name=name, digest=compute_digest(data, resolution, case_ids))
    profile = {
        "cases": len(case_ids),
        "layout": str(data.layout),
        "resolution": resolution.name,
        "spacing_mm": float(resolution.spacing_mm),
        "shape": "x".join(str(int(s)) for s in resolution.shape),
    }
    fields = dataset.to_dict()  # name, digest, source, source_type (a MetaDataset has no profile of its own)
    entity = Dataset(
        name=fields["name"],
        digest=fields["digest"],
        source_type=fields["source_type"],
        source=fields["source"],
        schema=fields.get("schema"),
        profile=json.dumps(profile),
    )
    return DatasetInput(dataset=entity, tags=[InputTag(key=CONTEXT_TAG, value=context)])
