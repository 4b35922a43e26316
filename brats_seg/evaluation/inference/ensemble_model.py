"""An ensemble's models as one model: what ``predict_volume`` averages (the folder, its checks and
its members' loading: :mod:`brats_seg.evaluation.inference.ensemble`,
:func:`~brats_seg.evaluation.inference.run.load_run_model`). Imports nothing of inference."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["Ensemble", "member_for"]


class Ensemble:
    """Several runs' models as one: ``predict_volume`` averages their probabilities.

    Attributes:
        models: the members' Keras models, in ``ensemble.json``'s order.
        val_by: a val case's member index where the members are folds (out-of-fold prediction);
            empty: every case is predicted by all members.
    """

    def __init__(self, models: Sequence, val_by: dict[str, int] | None = None) -> None:
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = list(models)
        self.val_by = dict(val_by or {})

    def __len__(self) -> int:
        return len(self.models)


def member_for(model, case_id: str, split: str):
    """The model that predicts ``case_id`` of ``split``: a fold ensemble's val case by the fold that
    held it out (its cross-validation prediction), anything else by ``model`` itself."""
    if isinstance(model, Ensemble) and split == "val" and case_id in model.val_by:
        return model.models[model.val_by[case_id]]
    return model
